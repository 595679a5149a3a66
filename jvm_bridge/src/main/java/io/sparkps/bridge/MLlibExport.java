package io.sparkps.bridge;

import org.apache.spark.ml.classification.GBTClassificationModel;
import org.apache.spark.ml.classification.LinearSVCModel;
import org.apache.spark.ml.classification.LogisticRegressionModel;
import org.apache.spark.ml.linalg.DenseMatrix;
import org.apache.spark.ml.linalg.Matrix;
import org.apache.spark.ml.linalg.SparseMatrix;
import org.apache.spark.ml.linalg.Vector;
import org.apache.spark.ml.linalg.Vectors;
import org.apache.spark.ml.regression.DecisionTreeRegressionModel;
import org.apache.spark.ml.regression.GBTRegressionModel;
import org.apache.spark.ml.regression.LinearRegressionModel;
import org.apache.spark.ml.tree.ContinuousSplit;
import org.apache.spark.ml.tree.InternalNode;
import org.apache.spark.ml.tree.LeafNode;
import org.apache.spark.ml.tree.Node;
import org.apache.spark.mllib.tree.impurity.VarianceCalculator;

/**
 * Builds genuine MLlib models from arrays that spark-ps trained, with MLlib's own
 * constructors, so the result transforms, saves and loads exactly like a model MLlib fitted.
 *
 * <p>Arrays arrive as raw little-endian bytes, each a {@code byte[]} or the path of a file
 * holding them (see {@link LittleEndian#raw}). The tree layout
 * is the spark-ps tree contract: parallel arrays, node 0 the root, children after parents,
 * {@code feature == -1} and {@code left == right == -1} at a leaf, {@code x[feature] <=
 * threshold} goes left.
 */
public final class MLlibExport {
    private MLlibExport() {}

    /** Binomial LR with dense coefficients (float64 bytes, one per feature). */
    public static LogisticRegressionModel logisticRegression(
            String uid, Object coefficients, double intercept) {
        double[] w = LittleEndian.doubles(coefficients, "LR coefficients");
        Matrix m = new DenseMatrix(1, w.length, w, true);
        return new LogisticRegressionModel(uid, m, Vectors.dense(new double[] {intercept}), 2,
            false);
    }

    /**
     * Binomial LR with sparse coefficients: int64 {@code indices} (strictly increasing, in
     * {@code [0, numFeatures)}) and float64 {@code values}. Kept sparse (a CSR row), as MLlib
     * itself stores a compressed coefficient matrix.
     */
    public static LogisticRegressionModel logisticRegressionSparse(
            String uid, int numFeatures, Object indices, Object values, double intercept) {
        long[] idx = LittleEndian.longs(indices, "LR coefficient indices");
        double[] v = LittleEndian.doubles(values, "LR coefficient values");
        if (idx.length != v.length) {
            throw new IllegalArgumentException("LR coefficients: " + idx.length
                + " indices but " + v.length + " values");
        }
        int[] cols = new int[idx.length];
        for (int i = 0; i < idx.length; i++) {
            if (idx[i] < 0 || idx[i] >= numFeatures || (i > 0 && idx[i] <= idx[i - 1])) {
                throw new IllegalArgumentException("LR coefficient index " + idx[i] + " at "
                    + i + " is not strictly increasing within [0, " + numFeatures + ")");
            }
            cols[i] = (int) idx[i];
        }
        Matrix m = new SparseMatrix(1, numFeatures, new int[] {0, cols.length}, cols, v, true);
        return new LogisticRegressionModel(uid, m, Vectors.dense(new double[] {intercept}), 2,
            false);
    }

    /**
     * Multinomial LR: {@code coefficients} float64 row-major {@code [numClasses, numFeatures]},
     * {@code intercepts} float64 {@code [numClasses]}.
     */
    public static LogisticRegressionModel multinomialLogisticRegression(
            String uid, int numClasses, Object coefficients, Object intercepts) {
        double[] w = LittleEndian.doubles(coefficients, "LR coefficient matrix");
        double[] b = LittleEndian.doubles(intercepts, "LR intercepts");
        if (numClasses < 2 || b.length != numClasses || w.length % numClasses != 0) {
            throw new IllegalArgumentException("multinomial LR: numClasses " + numClasses
                + ", " + b.length + " intercepts and " + w.length
                + " coefficients do not form a [numClasses, numFeatures] matrix");
        }
        Matrix m = new DenseMatrix(numClasses, w.length / numClasses, w, true);
        return new LogisticRegressionModel(uid, m, Vectors.dense(b), numClasses, true);
    }

    /**
     * LinearRegressionModel: coefficients dense ({@code indices} null, float64 {@code values}
     * of {@code numFeatures}) or sparse (int64 {@code indices}, strictly increasing), the
     * intercept and the huber {@code scale} (1.0 for squared error, as MLlib).
     */
    public static LinearRegressionModel linearRegression(String uid, int numFeatures,
            Object indices, Object values, double intercept, double scale) {
        Vector w = coefficientVector(numFeatures, indices, values, "LinearRegression");
        return new LinearRegressionModel(uid, w, intercept, scale);
    }

    /** LinearSVCModel; coefficients as in {@link #linearRegression}. */
    public static LinearSVCModel linearSVC(String uid, int numFeatures, Object indices,
            Object values, double intercept) {
        Vector w = coefficientVector(numFeatures, indices, values, "LinearSVC");
        return new LinearSVCModel(uid, w, intercept);
    }

    /** float64 values as a Java array (summaries take {@code double[]} histories). */
    public static double[] doubles(Object values) {
        return LittleEndian.doubles(values, "doubles");
    }

    private static Vector coefficientVector(int numFeatures, Object indices, Object values,
            String what) {
        double[] v = LittleEndian.doubles(values, what + " coefficient values");
        if (indices == null) {
            if (v.length != numFeatures) {
                throw new IllegalArgumentException(what + ": " + v.length
                    + " dense coefficients for numFeatures " + numFeatures);
            }
            return Vectors.dense(v);
        }
        long[] idx = LittleEndian.longs(indices, what + " coefficient indices");
        if (idx.length != v.length) {
            throw new IllegalArgumentException(what + " coefficients: " + idx.length
                + " indices but " + v.length + " values");
        }
        int[] cols = new int[idx.length];
        for (int i = 0; i < idx.length; i++) {
            if (idx[i] < 0 || idx[i] >= numFeatures || (i > 0 && idx[i] <= idx[i - 1])) {
                throw new IllegalArgumentException(what + " coefficient index " + idx[i]
                    + " at " + i + " is not strictly increasing within [0, " + numFeatures + ")");
            }
            cols[i] = (int) idx[i];
        }
        return Vectors.sparse(numFeatures, cols, v);
    }

    /** A binary GBT classifier (MLlib's logistic loss) from concatenated tree arrays. */
    public static GBTClassificationModel gbtClassifier(
            String uid, int numFeatures, Object treeSizes, Object feature, Object threshold,
            Object left, Object right, Object value, Object impurity, Object gain, Object count,
            Object treeWeights) {
        Trees t = new Trees(uid, numFeatures, treeSizes, feature, threshold, left, right, value,
            impurity, gain, count, treeWeights);
        return new GBTClassificationModel(uid, t.models, t.weights, numFeatures, 2);
    }

    /** A GBT regressor from concatenated tree arrays (see {@link #gbtClassifier}). */
    public static GBTRegressionModel gbtRegressor(
            String uid, int numFeatures, Object treeSizes, Object feature, Object threshold,
            Object left, Object right, Object value, Object impurity, Object gain, Object count,
            Object treeWeights) {
        Trees t = new Trees(uid, numFeatures, treeSizes, feature, threshold, left, right, value,
            impurity, gain, count, treeWeights);
        return new GBTRegressionModel(uid, t.models, t.weights, numFeatures);
    }

    /** One regression tree, MLlib's {@code DecisionTreeRegressionModel}, keeping {@code uid}. */
    public static DecisionTreeRegressionModel decisionTree(
            String uid, int numFeatures, Object treeSizes, Object feature, Object threshold,
            Object left, Object right, Object value, Object impurity, Object gain, Object count,
            Object treeWeights) {
        Trees t = new Trees(uid, numFeatures, treeSizes, feature, threshold, left, right, value,
            impurity, gain, count, treeWeights);
        if (t.models.length != 1) {
            throw new IllegalArgumentException("tree export: " + t.models.length
                + " trees given, need exactly one");
        }
        return new DecisionTreeRegressionModel(uid, t.models[0].rootNode(), numFeatures);
    }

    /** Decodes the concatenated arrays of every tree and builds MLlib's tree models. */
    private static final class Trees {
        final DecisionTreeRegressionModel[] models;
        final double[] weights;

        Trees(String uid, int numFeatures, Object treeSizes, Object feature, Object threshold,
                Object left, Object right, Object value, Object impurity, Object gain,
                Object count, Object treeWeights) {
            int[] sizes = LittleEndian.ints(treeSizes, "tree sizes");
            weights = LittleEndian.doubles(treeWeights, "treeWeights");
            if (sizes.length != weights.length || sizes.length == 0) {
                throw new IllegalArgumentException("GBT export: " + sizes.length + " trees but "
                    + weights.length + " treeWeights (need the same number, at least one)");
            }
            if (numFeatures < 1) {
                throw new IllegalArgumentException("GBT export: numFeatures must be >= 1, got "
                    + numFeatures);
            }
            TreeArrays all = new TreeArrays(
                LittleEndian.ints(feature, "feature"), LittleEndian.doubles(threshold, "threshold"),
                LittleEndian.ints(left, "left"), LittleEndian.ints(right, "right"),
                LittleEndian.doubles(value, "value"), LittleEndian.doubles(impurity, "impurity"),
                LittleEndian.doubles(gain, "gain"), LittleEndian.doubles(count, "count"));
            long total = 0;
            for (int s : sizes) {
                total += s;
            }
            all.checkLengths(total);
            models = new DecisionTreeRegressionModel[sizes.length];
            int offset = 0;
            for (int t = 0; t < sizes.length; t++) {
                Node root = all.build(offset, sizes[t], numFeatures, "tree " + t);
                models[t] = new DecisionTreeRegressionModel(uid + "_tree" + t, root, numFeatures);
                offset += sizes[t];
            }
        }
    }

    /** The contract arrays of all trees back to back; {@link #build} makes one tree. */
    private record TreeArrays(int[] feature, double[] threshold, int[] left, int[] right,
            double[] value, double[] impurity, double[] gain, double[] count) {

        void checkLengths(long total) {
            int[] lengths = {feature.length, threshold.length, left.length, right.length,
                value.length, impurity.length, gain.length, count.length};
            String[] names = {"feature", "threshold", "left", "right", "value", "impurity",
                "gain", "count"};
            for (int i = 0; i < lengths.length; i++) {
                if (lengths[i] != total) {
                    throw new IllegalArgumentException("GBT export: " + names[i] + " holds "
                        + lengths[i] + " nodes but the tree sizes add up to " + total);
                }
            }
        }

        /** Nodes {@code [offset, offset + n)}; children come after parents, so build backwards. */
        Node build(int offset, int n, int numFeatures, String where) {
            if (n < 1) {
                throw new IllegalArgumentException(where + ": a tree needs at least one node");
            }
            Node[] nodes = new Node[n];
            boolean[] hasParent = new boolean[n];
            for (int i = n - 1; i >= 0; i--) {
                int g = offset + i;
                double c = count[g];
                double mean = value[g];
                // Variance stats [weight, sum, sum of squares] consistent with (count, value,
                // impurity): MLlib keeps them for featureImportances and save/load.
                double[] stats = {c, c * mean, c * (impurity[g] + mean * mean)};
                VarianceCalculator calc = new VarianceCalculator(stats, Math.round(c));
                if (feature[g] < 0) {
                    if (left[g] != -1 || right[g] != -1) {
                        throw new IllegalArgumentException(where + ", node " + i + ": a leaf "
                            + "(feature -1) has children left=" + left[g] + " right=" + right[g]);
                    }
                    nodes[i] = new LeafNode(value[g], impurity[g], calc);
                    continue;
                }
                if (feature[g] >= numFeatures) {
                    throw new IllegalArgumentException(where + ", node " + i + ": feature "
                        + feature[g] + " is not in [0, numFeatures=" + numFeatures + ")");
                }
                Node l = child(nodes, hasParent, i, left[g], n, where, "left");
                Node r = child(nodes, hasParent, i, right[g], n, where, "right");
                nodes[i] = new InternalNode(value[g], impurity[g], gain[g], l, r,
                    new ContinuousSplit(feature[g], threshold[g]), calc);
            }
            for (int i = 1; i < n; i++) {
                if (!hasParent[i]) {
                    throw new IllegalArgumentException(where + ", node " + i
                        + ": not reachable from the root (no parent points to it)");
                }
            }
            return nodes[0];
        }

        private static Node child(Node[] nodes, boolean[] hasParent, int parent, int c, int n,
                String where, String side) {
            if (c <= parent || c >= n) {
                throw new IllegalArgumentException(where + ", node " + parent + ": " + side
                    + " child " + c + " is not in (" + parent + ", " + n + ") (children come "
                    + "after parents)");
            }
            if (hasParent[c]) {
                throw new IllegalArgumentException(where + ", node " + c
                    + " has two parents (second: node " + parent + ")");
            }
            hasParent[c] = true;
            return nodes[c];
        }
    }
}
