package io.sparkps.bridge;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;

/**
 * Raw little-endian buffers (numpy's {@code tobytes()} on x86/ARM) to and from Java arrays.
 *
 * <p>Arrays cross py4j and the PS wire as one {@code byte[]} each, never element by element.
 */
public final class LittleEndian {
    private LittleEndian() {}

    private static ByteBuffer wrap(byte[] raw, int width, String what) {
        if (raw == null) {
            throw new IllegalArgumentException(what + ": null buffer");
        }
        if (raw.length % width != 0) {
            throw new IllegalArgumentException(what + ": " + raw.length
                + " bytes is not a multiple of the " + width + "-byte element (truncated?)");
        }
        return ByteBuffer.wrap(raw).order(ByteOrder.LITTLE_ENDIAN);
    }

    /** float64 values. */
    public static double[] doubles(byte[] raw, String what) {
        double[] out = new double[raw == null ? 0 : raw.length / 8];
        wrap(raw, 8, what).asDoubleBuffer().get(out);
        return out;
    }

    /** float32 values widened to double. */
    public static double[] floatsAsDoubles(byte[] raw, String what) {
        float[] f = new float[raw == null ? 0 : raw.length / 4];
        wrap(raw, 4, what).asFloatBuffer().get(f);
        double[] out = new double[f.length];
        for (int i = 0; i < f.length; i++) {
            out[i] = f[i];
        }
        return out;
    }

    /** int32 values. */
    public static int[] ints(byte[] raw, String what) {
        int[] out = new int[raw == null ? 0 : raw.length / 4];
        wrap(raw, 4, what).asIntBuffer().get(out);
        return out;
    }

    /** int64 values. */
    public static long[] longs(byte[] raw, String what) {
        long[] out = new long[raw == null ? 0 : raw.length / 8];
        wrap(raw, 8, what).asLongBuffer().get(out);
        return out;
    }

    /** float64 values as raw bytes. */
    public static byte[] bytes(double[] values) {
        ByteBuffer b = ByteBuffer.allocate(values.length * 8).order(ByteOrder.LITTLE_ENDIAN);
        b.asDoubleBuffer().put(values);
        return b.array();
    }
}
