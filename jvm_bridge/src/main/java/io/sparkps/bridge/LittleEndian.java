package io.sparkps.bridge;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Files;
import java.nio.file.Path;

/**
 * Raw little-endian buffers (numpy's {@code tobytes()} on x86/ARM) to and from Java arrays.
 *
 * <p>Arrays cross py4j and the PS wire as one {@code byte[]} each, never element by element.
 * Large arrays from Python come as the path of a file holding the raw bytes instead (py4j
 * moves {@code bytes} at a few tens of MB/s; a local file is read at disk-cache speed), so
 * every array parameter of the bridge is an {@code Object}: a {@code byte[]} or a path.
 */
public final class LittleEndian {
    private LittleEndian() {}

    /** The raw bytes of {@code source}: a {@code byte[]} as is, or a path's whole content. */
    public static byte[] raw(Object source, String what) {
        if (source instanceof byte[] b) {
            return b;
        }
        if (source instanceof String path) {
            try {
                return Files.readAllBytes(Path.of(path));
            } catch (IOException e) {
                throw new UncheckedIOException(what + ": cannot read " + path, e);
            }
        }
        throw new IllegalArgumentException(what + ": expected byte[] or a file path, got "
            + (source == null ? "null" : source.getClass().getName()));
    }

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

    /** float64 values of a {@code byte[]} or file (see {@link #raw}). */
    public static double[] doubles(Object source, String what) {
        return doubles(raw(source, what), what);
    }

    /** int32 values of a {@code byte[]} or file (see {@link #raw}). */
    public static int[] ints(Object source, String what) {
        return ints(raw(source, what), what);
    }

    /** int64 values of a {@code byte[]} or file (see {@link #raw}). */
    public static long[] longs(Object source, String what) {
        return longs(raw(source, what), what);
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
