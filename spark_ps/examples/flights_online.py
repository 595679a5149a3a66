"""Online learning: FTRL-proximal LR on the PS, trained by a Structured Streaming query.

The flights of January to May 2001 are cut into time-ordered parquet files; a
file-source stream reads one file per micro-batch and the learner scores each batch
before learning from it (progressive validation), so the printed logloss is that of a
model that has never seen the rows it scores. Features: the fields and crosses of
``flights_lr``, each hashed with xxhash64 into int64 keys of a 2^30 space (PS
memory grows with the keys seen). The model is then tested on June.

    python -m spark_ps.examples.flights_online                    # 12 batches over 20% of the rows
    python -m spark_ps.examples.flights_online --fraction 1 --files 24 --compare   # + batch FTRL
    spark-submit --master spark://host:7077 examples/flights_online.py

The stream's files are written by the driver to a local temporary folder: on a cluster,
give ``--work-dir`` a folder every executor reads at the same path (e.g. NFS).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

from spark_ps.examples.flights_common import flights, hashed_keys, roc_auc, session


def write_time_ordered_files(train, directory: Path, files: int) -> int:
    """The training rows (already in time order) as ``files`` consecutive parquet files."""
    table = train.select("label", "keys").toArrow()
    step = -(-table.num_rows // files)
    for i in range(files):
        pq.write_table(table.slice(i * step, step), directory / f"part-{i:04d}.parquet")
    return table.num_rows


def watch(query, learner) -> None:
    """Print each micro-batch's progressive metrics as the query reports them."""
    from spark_ps.ml.online import OBSERVATION

    printed = -1
    while query.isActive or printed < (query.lastProgress or {}).get("batchId", -1):
        for p in query.recentProgress:
            m = p.get("observedMetrics", {}).get(OBSERVATION)
            if p["batchId"] > printed and m is not None:
                printed = p["batchId"]
                run = next(h for h in learner.history if h["batchId"] == printed)
                print(
                    f"batch {printed:3d}  rows {m['rows']:7,d}  progressive logloss "
                    f"{m['logloss']:.4f}  auc {m['auc']:.4f}  |  running logloss "
                    f"{run['runningLogloss']:.4f}  auc {run['runningAuc']:.4f}  "
                    f"({p['durationMs'].get('triggerExecution', 0) / 1000:.1f} s)"
                )
        time.sleep(0.5)
    query.awaitTermination()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--log2-dim", type=int, default=30)
    p.add_argument("--files", type=int, default=12, help="micro-batches")
    p.add_argument("--fraction", type=float, default=0.2, help="sample of the rows")
    p.add_argument("--alpha", type=float, default=0.05)
    p.add_argument("--l1", type=float, default=0.0)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--compare", action="store_true", help="also fit batch FTRL (one epoch)")
    p.add_argument("--data", help="flights-3m.parquet (default: $SPARK_PS_DATA/...)")
    p.add_argument("--work-dir", help="where the stream's files go (default: a temp dir)")
    args = p.parse_args()

    spark = session("spark-ps flights online FTRL")
    spark.sparkContext.setLogLevel("ERROR")
    from spark_ps import PSContext
    from spark_ps.ml.online import OnlineLogisticRegression

    ps = PSContext.getOrCreate(spark)
    train, test = flights(spark, args.data, args.fraction)
    train, test = hashed_keys(train, args.log2_dim), hashed_keys(test, args.log2_dim)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="flights-online-"))
    (work / "stream").mkdir(parents=True, exist_ok=True)
    n = write_time_ordered_files(train, work / "stream", args.files)
    print(f"PS: {ps}\n{n:,} training rows in {args.files} time-ordered files under {work}")

    learner = OnlineLogisticRegression(
        featuresCol="keys",
        numFeatures=2**args.log2_dim,
        alpha=args.alpha,
        l1=args.l1,
        batchSize=args.batch_size,
    )
    stream = (
        spark.readStream.schema(spark.read.parquet(str(work / "stream")).schema)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(work / "stream"))
    )
    t = time.perf_counter()
    query = learner.trainOn(stream, str(work / "checkpoint"), trigger={"availableNow": True})
    watch(query, learner)
    secs = time.perf_counter() - t
    fp = learner.footprint()
    print(
        f"online FTRL: {secs:.1f} s for {args.files} batches; PS holds {fp['keys']:,} keys "
        f"({fp['nbytes'] / 2**20:.1f} MiB) of a 2^{args.log2_dim} space; "
        f"test AUC {roc_auc(learner.latestModel(), test):.4f}"
    )
    if args.compare:
        from spark_ps.ml.classification import LogisticRegression

        batch = LogisticRegression(
            solver="ftrl",
            stepSize=args.alpha,
            batchSize=args.batch_size,
            maxIter=1,
            regParam=0.0,
            featuresCol="keys",
        )
        t = time.perf_counter()
        model = batch.fit(spark.read.parquet(str(work / "stream")))
        print(
            f"batch FTRL (1 epoch): {time.perf_counter() - t:.1f} s, "
            f"test AUC {roc_auc(model, test):.4f}"
        )
    spark.stop()


if __name__ == "__main__":
    main()
