package io.sparkps.bridge;

import org.apache.spark.ml.classification.FMClassificationModel;
import org.apache.spark.ml.linalg.DenseMatrix;
import org.apache.spark.ml.linalg.Vector;
import org.apache.spark.ml.linalg.Vectors;
import org.apache.spark.ml.regression.FMRegressionModel;

/**
 * Builds genuine MLlib factorization-machine models from arrays spark-ps trained, with MLlib's
 * own constructors.
 *
 * <p>{@code factors} is float64 row-major {@code [numFeatures, factorSize]} and {@code linear}
 * float64 {@code [numFeatures]}, each raw little-endian bytes or the path of a file holding
 * them (see {@link LittleEndian#raw}). Without {@code fitLinear} the linear vector is an empty
 * sparse vector of size numFeatures, as MLlib's own fit leaves it.
 */
public final class FMExport {
    private FMExport() {}

    public static FMClassificationModel classifier(String uid, int numFeatures, int factorSize,
            Object factors, Object linear, double intercept, boolean fitLinear) {
        return new FMClassificationModel(uid, intercept, linearVector(numFeatures, linear,
            fitLinear), factorMatrix(numFeatures, factorSize, factors));
    }

    public static FMRegressionModel regressor(String uid, int numFeatures, int factorSize,
            Object factors, Object linear, double intercept, boolean fitLinear) {
        return new FMRegressionModel(uid, intercept, linearVector(numFeatures, linear,
            fitLinear), factorMatrix(numFeatures, factorSize, factors));
    }

    private static DenseMatrix factorMatrix(int numFeatures, int factorSize, Object factors) {
        double[] v = LittleEndian.doubles(factors, "FM factors");
        if (numFeatures < 1 || factorSize < 1 || v.length != (long) numFeatures * factorSize) {
            throw new IllegalArgumentException("FM factors: " + v.length + " values do not form"
                + " a " + numFeatures + " x " + factorSize + " matrix");
        }
        return new DenseMatrix(numFeatures, factorSize, v, true);
    }

    private static Vector linearVector(int numFeatures, Object linear, boolean fitLinear) {
        double[] w = LittleEndian.doubles(linear, "FM linear weights");
        if (w.length != numFeatures) {
            throw new IllegalArgumentException("FM linear weights: " + w.length
                + " values for " + numFeatures + " features");
        }
        if (!fitLinear) {
            return Vectors.sparse(numFeatures, new int[0], new double[0]);
        }
        return Vectors.dense(w);
    }
}
