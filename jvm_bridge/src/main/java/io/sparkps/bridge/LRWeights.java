package io.sparkps.bridge;

import java.io.Serializable;

/**
 * The non-zero coefficients of a binomial LR model, as executors score with them.
 *
 * <p>It travels (in a broadcast, once per executor) as sorted unique int64 {@code keys} and
 * their {@code values} only: a 2^24-feature model with a few hundred thousand non-zeros is a
 * few MB on the wire, not MLlib's 128 MB dense array per task. Each executor JVM then builds
 * its lookup once: a dense {@code double[]} when the key space is small or well filled, else
 * an open-addressing table (linear probing, key and value bits side by side so one probe
 * touches one cache line), which also serves keys far beyond 2^31.
 */
public final class LRWeights implements Serializable {
    private static final long serialVersionUID = 1L;

    /**
     * A dense array is used up to this many features (32 MB)... Beyond, a dense 2^24 array
     * (128 MB per model and executor) looked up ~1.5x faster than the table in isolation but
     * not in whole transforms on a loaded machine, so the table's memory wins.
     */
    static final long DENSE_MAX = 1L << 22;
    /** ...or beyond, while it is at most this many times the size of the hash table. */
    static final long DENSE_FILL = 8;
    private static final long EMPTY = -1L;

    final long numFeatures;
    final double intercept;
    private final long[] keys;
    private final double[] values;

    private transient volatile boolean built;
    private transient double[] dense;
    private transient long[] table;
    private transient int shift;
    private transient int mask;

    /**
     * Binomial LR coefficients: {@code keys} strictly increasing in {@code [0, numFeatures)},
     * {@code values} finite, one per key.
     */
    public LRWeights(long numFeatures, Object keys, Object values, double intercept) {
        this.keys = LittleEndian.longs(keys, "LR coefficient keys");
        this.values = LittleEndian.doubles(values, "LR coefficient values");
        this.numFeatures = numFeatures;
        this.intercept = intercept;
        if (this.keys.length != this.values.length) {
            throw new IllegalArgumentException("LR coefficients: " + this.keys.length
                + " keys but " + this.values.length + " values");
        }
        for (int i = 0; i < this.keys.length; i++) {
            long k = this.keys[i];
            if (k < 0 || k >= numFeatures || (i > 0 && k <= this.keys[i - 1])) {
                throw new IllegalArgumentException("LR coefficient key " + k + " at " + i
                    + " is not strictly increasing within [0, " + numFeatures + ")");
            }
        }
    }

    /** Number of stored (non-zero) coefficients. */
    public int size() {
        return keys.length;
    }

    /** Whether this JVM looks weights up in a dense array (else in a hash table). */
    public boolean isDense() {
        ensureBuilt();
        return dense != null;
    }

    /** The coefficient of feature {@code key} (0.0 for a key the model does not hold). */
    double get(long key) {
        double[] d = dense;
        if (d != null) {
            return d[(int) key];
        }
        long[] t = table;
        int slot = (int) ((key * 0x9E3779B97F4A7C15L) >>> shift) << 1;
        while (true) {
            long k = t[slot];
            if (k == key) {
                return Double.longBitsToDouble(t[slot + 1]);
            }
            if (k == EMPTY) {
                return 0.0;
            }
            slot = (slot + 2) & mask;
        }
    }

    /** Build this JVM's lookup once; callers run it before the first {@link #get}. */
    void ensureBuilt() {
        if (!built) {
            synchronized (this) {
                if (!built) {
                    build();
                    built = true;
                }
            }
        }
    }

    private void build() {
        int bits = 1;
        while ((1L << bits) < 2L * keys.length) {
            bits++;
        }
        if (numFeatures <= Integer.MAX_VALUE - 8
                && (numFeatures <= DENSE_MAX || numFeatures <= DENSE_FILL * (1L << bits))) {
            double[] d = new double[(int) numFeatures];
            for (int i = 0; i < keys.length; i++) {
                d[(int) keys[i]] = values[i];
            }
            dense = d;
            return;
        }
        long[] t = new long[2 << bits];
        java.util.Arrays.fill(t, EMPTY);
        int m = t.length - 1;
        for (int i = 0; i < keys.length; i++) {
            int slot = (int) ((keys[i] * 0x9E3779B97F4A7C15L) >>> (64 - bits)) << 1;
            while (t[slot] != EMPTY) {
                slot = (slot + 2) & m;
            }
            t[slot] = keys[i];
            t[slot + 1] = Double.doubleToRawLongBits(values[i]);
        }
        shift = 64 - bits;
        mask = m;
        table = t;
    }
}
