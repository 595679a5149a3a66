package io.sparkps.bridge;

import org.apache.spark.TaskContext;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.broadcast.Broadcast;
import org.apache.spark.ml.linalg.DenseVector;
import org.apache.spark.ml.linalg.SQLDataTypes;
import org.apache.spark.ml.linalg.SparseVector;
import org.apache.spark.ml.linalg.Vector;
import org.apache.spark.ml.linalg.Vectors;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.api.java.UDF1;
import org.apache.spark.sql.api.java.UDF2;
import org.apache.spark.sql.expressions.UserDefinedFunction;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.DataTypes;

/**
 * Scores a binomial spark-ps LR model entirely in the JVM: no Python worker, no Arrow.
 *
 * <p>One UDF computes each row's margin {@code x . w + b} (summed in the row's stored order
 * from 0.0, as MLlib's sparse dot); small UDFs turn it into MLlib's rawPrediction
 * {@code [-m, m]}, probability {@code [p0, 1 - p0]} with {@code p0 = 1 / (1 + exp(m))} and
 * prediction, with {@link Math#exp} as MLlib's, so the numbers are MLlib's bit for bit.
 * Rows MLlib would choke on (null, wrong size, index out of range, NaN/inf values) fail the
 * task with a message that names the column, the row within the partition and the partition,
 * as the Python scoring path does.
 */
public final class LRScoring {
    private LRScoring() {}

    /** Prediction from rawPrediction (margin vs its threshold), probability, or the score. */
    public static final int PREDICT_RAW = 0;
    public static final int PREDICT_PROBABILITY = 1;
    public static final int PREDICT_SCORE = 2;

    /** A driver-side handle: the weights broadcast once, reused by every transform. */
    public static final class Scorer {
        final Broadcast<LRWeights> weights;
        final long numFeatures;

        Scorer(Broadcast<LRWeights> weights, long numFeatures) {
            this.weights = weights;
            this.numFeatures = numFeatures;
        }

        /** Release the broadcast on the executors and the driver. */
        public void destroy() {
            weights.destroy();
        }
    }

    /** Broadcast {@code weights} in {@code spark}'s context (one copy per executor). */
    public static Scorer scorer(SparkSession spark, LRWeights weights) {
        JavaSparkContext jsc = JavaSparkContext.fromSparkContext(spark.sparkContext());
        return new Scorer(jsc.broadcast(weights), weights.numFeatures);
    }

    /**
     * {@code df} with the requested output columns appended (an empty name skips a column).
     *
     * @param features quoted reference of the features column: a vector, or {@code
     *     array<bigint>} keys when {@code values} (an {@code array<double>} column reference, or
     *     null for 1.0 each) or {@code keys} is set
     * @param name the features column's name, for error messages
     * @param predictFrom {@link #PREDICT_RAW}: {@code m > rawThreshold}; {@link
     *     #PREDICT_PROBABILITY}: {@code 1 - p0 > threshold}; {@link #PREDICT_SCORE}: {@code
     *     1 / (1 + exp(-m)) > threshold} (MLlib's three rules, by which columns exist)
     */
    public static Dataset<Row> transform(Dataset<Row> df, Scorer scorer, String features,
            boolean keys, String values, String name, String rawCol, String probCol,
            String predCol, int predictFrom, double threshold, double rawThreshold) {
        Column margin;
        if (keys) {
            KeysMargin fn = new KeysMargin(scorer.weights, name, values != null);
            Column k = functions.col(features).cast("array<bigint>");
            Column v = functions.lit(null).cast("array<double>");
            if (values != null) {
                v = functions.col(values).cast("array<double>");
            }
            margin = functions.udf((UDF2<?, ?, ?>) fn, DataTypes.DoubleType).asNonNullable()
                .apply(k, v);
        } else {
            VectorMargin fn = new VectorMargin(scorer.weights, name);
            margin = functions.udf((UDF1<?, ?>) fn, DataTypes.DoubleType).asNonNullable()
                .apply(functions.col(features));
        }
        String m = "__spark_ps_margin_" + java.util.UUID.randomUUID().toString().replace("-", "");
        Dataset<Row> out = df.withColumn(m, margin);
        Column mc = out.col(m);
        if (!rawCol.isEmpty()) {
            out = out.withColumn(rawCol, udf1(new Raw(), true).apply(mc));
        }
        if (!probCol.isEmpty()) {
            out = out.withColumn(probCol, udf1(new Probability(), true).apply(mc));
        }
        if (!predCol.isEmpty()) {
            Prediction p = new Prediction(predictFrom, threshold, rawThreshold);
            out = out.withColumn(predCol, udf1(p, false).apply(mc));
        }
        return out.drop(m);
    }

    private static UserDefinedFunction udf1(UDF1<?, ?> fn, boolean vector) {
        UserDefinedFunction u = functions.udf(fn,
            vector ? SQLDataTypes.VectorType() : DataTypes.DoubleType);
        return u.asNonNullable();
    }

    /** Counts rows in one task's copy of a margin UDF, for error messages. */
    abstract static class Margin implements java.io.Serializable {
        private static final long serialVersionUID = 1L;
        final Broadcast<LRWeights> bc;
        final String what;
        private transient LRWeights w;
        private transient long row;

        Margin(Broadcast<LRWeights> bc, String name) {
            this.bc = bc;
            this.what = "features column '" + name + "'";
        }

        final LRWeights weights() {
            row++;
            if (w == null) {
                w = bc.value();
                w.ensureBuilt();
            }
            return w;
        }

        final IllegalArgumentException bad(String message) {
            TaskContext ctx = TaskContext.get();
            String where = ctx == null ? "" : " (partition " + ctx.partitionId() + ")";
            return new IllegalArgumentException(what + ": " + message.replace("@ROW",
                "row " + (row - 1)) + where);
        }

        final void checkFinite(double v) {
            if (!Double.isFinite(v)) {
                String shown = Double.isNaN(v) ? "nan" : v > 0 ? "inf" : "-inf";  // as numpy
                throw bad("value " + shown + " at @ROW is not finite "
                    + "(NaN/inf features are not allowed)");
            }
        }
    }

    /** Margin of a VectorUDT row. */
    static final class VectorMargin extends Margin implements UDF1<Vector, Double> {
        private static final long serialVersionUID = 1L;

        VectorMargin(Broadcast<LRWeights> bc, String name) {
            super(bc, name);
        }

        @Override
        public Double call(Vector x) {
            LRWeights w = weights();
            if (x == null) {
                throw bad("null vector: null at @ROW");
            }
            if (x.size() != w.numFeatures) {
                throw bad("vector size " + x.size() + " at @ROW differs from num_features="
                    + w.numFeatures);
            }
            double sum = 0.0;
            if (x instanceof SparseVector sv) {
                int[] idx = sv.indices();
                double[] v = sv.values();
                if (idx.length != v.length) {
                    throw bad("sparse vector at @ROW has " + idx.length + " indices but "
                        + v.length + " values");
                }
                int n = sv.size();
                for (int k = 0; k < idx.length; k++) {
                    int i = idx[k];
                    if (i < 0 || i >= n) {
                        throw bad("index " + i + " out of range [0, " + n + ") at @ROW");
                    }
                    checkFinite(v[k]);
                    sum += v[k] * w.get(i);
                }
            } else {
                double[] v = ((DenseVector) x).values();
                for (int i = 0; i < v.length; i++) {
                    checkFinite(v[i]);
                    sum += v[i] * w.get(i);
                }
            }
            return sum + w.intercept;
        }
    }

    /** Margin of an {@code array<bigint>} keys row with optional {@code array<double>} values. */
    static final class KeysMargin extends Margin
            implements UDF2<scala.collection.Seq<Object>, scala.collection.Seq<Object>, Double> {
        private static final long serialVersionUID = 1L;

        private final boolean withValues;

        KeysMargin(Broadcast<LRWeights> bc, String name, boolean withValues) {
            super(bc, name);
            this.withValues = withValues;
        }

        @Override
        public Double call(scala.collection.Seq<Object> keys, scala.collection.Seq<Object> values) {
            LRWeights w = weights();
            if (keys == null) {
                throw bad("null keys array: null at @ROW");
            }
            if (withValues && values == null) {
                throw bad("null values array at @ROW");
            }
            int n = keys.length();
            if (withValues && values.length() != n) {
                throw bad(n + " keys but " + values.length() + " values at @ROW");
            }
            double sum = 0.0;
            for (int k = 0; k < n; k++) {
                Object key = keys.apply(k);
                if (key == null) {
                    throw bad("null element at @ROW");
                }
                long i = (Long) key;
                if (i < 0 || i >= w.numFeatures) {
                    throw bad("key " + i + " at @ROW outside [0, num_features="
                        + w.numFeatures + ")");
                }
                double v = 1.0;
                if (withValues) {
                    Object x = values.apply(k);
                    if (x == null) {
                        throw bad("null value at @ROW");
                    }
                    v = (Double) x;
                    checkFinite(v);
                }
                sum += v * w.get(i);
            }
            return sum + w.intercept;
        }
    }

    /** MLlib's binomial rawPrediction: {@code [-m, m]}. */
    static final class Raw implements UDF1<Double, Vector> {
        private static final long serialVersionUID = 1L;

        @Override
        public Vector call(Double m) {
            return Vectors.dense(new double[] {-m, m});
        }
    }

    /** MLlib's raw2probability of {@code [-m, m]}: {@code p0 = 1 / (1 + exp(m))}, 1 - p0. */
    static final class Probability implements UDF1<Double, Vector> {
        private static final long serialVersionUID = 1L;

        @Override
        public Vector call(Double m) {
            double p0 = 1.0 / (1.0 + Math.exp(m));
            return Vectors.dense(new double[] {p0, 1.0 - p0});
        }
    }

    /** MLlib's binomial prediction rules (see {@link #transform}). */
    static final class Prediction implements UDF1<Double, Double> {
        private static final long serialVersionUID = 1L;
        private final int from;
        private final double threshold;
        private final double rawThreshold;

        Prediction(int from, double threshold, double rawThreshold) {
            this.from = from;
            this.threshold = threshold;
            this.rawThreshold = rawThreshold;
        }

        @Override
        public Double call(Double m) {
            boolean one = switch (from) {
                case PREDICT_RAW -> m > rawThreshold;
                case PREDICT_PROBABILITY -> 1.0 - 1.0 / (1.0 + Math.exp(m)) > threshold;
                default -> 1.0 / (1.0 + Math.exp(-m)) > threshold;
            };
            return one ? 1.0 : 0.0;
        }
    }
}
