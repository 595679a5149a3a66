"""spark-submit launcher of ``spark_ps.examples.flights_lr`` (the job and its options).

spark-submit examples/flights_lr.py --help
python -m spark_ps.examples.flights_lr --help    # the same job, installed
"""

from spark_ps.examples.flights_lr import main

if __name__ == "__main__":
    main()
