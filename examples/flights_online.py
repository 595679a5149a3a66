"""spark-submit launcher of ``spark_ps.examples.flights_online`` (the job and its options).

spark-submit examples/flights_online.py --help
python -m spark_ps.examples.flights_online --help    # the same job, installed
"""

from spark_ps.examples.flights_online import main

if __name__ == "__main__":
    main()
