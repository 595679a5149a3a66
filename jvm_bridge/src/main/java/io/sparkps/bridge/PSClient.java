package io.sparkps.bridge;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;

/**
 * Reads a model's parameters from the PS shards, so JVM code (a Scala stage, a serving job)
 * can use what spark-ps trained.
 *
 * <p>Dense tensors are range-partitioned exactly as {@code ps_server.keys.range_bounds}: the
 * first {@code dim % numShards} shards own one extra key. Values come back row-major
 * ({@code cols} per key) as float64, whatever the stored dtype. A pull is split into requests
 * of at most {@code maxMessageBytes} that run concurrently (up to 8 at a time).
 */
public class PSClient implements AutoCloseable {
    private final PSCoordinatorClient ps;
    private final long maxMessageBytes;
    private ExecutorService pool;

    /**
     * @param address coordinator {@code host:port} ({@code spark.ps.address})
     * @param token auth token ({@code spark.ps.token})
     */
    public PSClient(String address, String token) {
        this(new PSCoordinatorClient(address, token), 4L << 20);
    }

    /**
     * @param ps the connection to use (not closed by {@link #close()} unless owned)
     * @param maxMessageBytes largest response asked for in one Pull (requests are chunked)
     */
    public PSClient(PSCoordinatorClient ps, long maxMessageBytes) {
        if (maxMessageBytes < 16) {
            throw new IllegalArgumentException("maxMessageBytes must be >= 16, got "
                + maxMessageBytes);
        }
        this.ps = ps;
        this.maxMessageBytes = maxMessageBytes;
    }

    public PSCoordinatorClient coordinator() {
        return ps;
    }

    /** Range bounds of a dense tensor: shard {@code s} owns {@code [b[s], b[s+1])}. */
    public static long[] rangeBounds(long dim, int numShards) {
        if (numShards < 1) {
            throw new IllegalArgumentException("numShards must be >= 1, got " + numShards);
        }
        long base = dim / numShards;
        long extra = dim % numShards;
        long[] b = new long[numShards + 1];
        for (int s = 0; s < numShards; s++) {
            b[s + 1] = b[s] + base + (s < extra ? 1 : 0);
        }
        return b;
    }

    /** Every value of dense model {@code model}, row-major. */
    public double[] pullDense(String model) {
        PSCoordinatorClient.ModelSpec spec = ps.model(model);
        return pullDense(spec, 0, spec.dim());
    }

    /** Values of keys {@code [start, stop)} of dense model {@code model}, row-major. */
    public double[] pullDense(String model, long start, long stop) {
        return pullDense(ps.model(model), start, stop);
    }

    /** As {@link #pullDense(String, long, long)}, as raw little-endian float64 bytes. */
    public byte[] pullDenseBytes(String model, long start, long stop) {
        return LittleEndian.bytes(pullDense(model, start, stop));
    }

    private double[] pullDense(PSCoordinatorClient.ModelSpec spec, long start, long stop) {
        if (!"dense".equals(spec.kind())) {
            throw new IllegalArgumentException("model '" + spec.name() + "' is " + spec.kind()
                + ", not dense: a range pull needs a dense tensor");
        }
        if (start < 0 || start > stop || stop > spec.dim()) {
            throw new IllegalArgumentException("pull range [" + start + ", " + stop
                + ") of model '" + spec.name() + "' is outside [0, " + spec.dim() + ")");
        }
        long n = (stop - start) * spec.cols();
        if (n > Integer.MAX_VALUE - 8) {
            throw new IllegalArgumentException("pull range [" + start + ", " + stop + ") of '"
                + spec.name() + "' holds " + n + " values, more than one Java array can");
        }
        String[] shards = ps.shardMap();
        if (shards.length != spec.numShards()) {
            throw new IllegalStateException("model '" + spec.name() + "' was made for "
                + spec.numShards() + " shards but the PS has " + shards.length);
        }
        long[] bounds = rangeBounds(spec.dim(), shards.length);
        long rows = Math.max(1, maxMessageBytes / (8 * spec.cols()));
        double[] out = new double[(int) n];
        List<Future<?>> parts = new ArrayList<>();
        for (int s = 0; s < shards.length; s++) {
            long lo = Math.max(start, bounds[s]);
            long hi = Math.min(stop, bounds[s + 1]);
            for (long i = lo; i < hi; i += rows) {
                String shard = shards[s];
                long a = i;
                long b = Math.min(hi, i + rows);
                parts.add(pool().submit(() -> {
                    double[] part = pullChunk(shard, spec, a, b);
                    System.arraycopy(part, 0, out, (int) ((a - start) * spec.cols()), part.length);
                }));
            }
        }
        for (Future<?> f : parts) {
            try {
                f.get();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new IllegalStateException("interrupted while pulling " + spec.name(), e);
            } catch (ExecutionException e) {
                if (e.getCause() instanceof RuntimeException r) {
                    throw r;
                }
                throw new IllegalStateException(e.getCause());
            }
        }
        return out;
    }

    private synchronized ExecutorService pool() {
        if (pool == null) {
            pool = Executors.newFixedThreadPool(8, r -> {
                Thread t = new Thread(r, "spark-ps-pull");
                t.setDaemon(true);
                return t;
            });
        }
        return pool;
    }

    private double[] pullChunk(String shard, PSCoordinatorClient.ModelSpec spec, long i, long j) {
        byte[] req = new Proto.Writer()
            .string(1, spec.name())
            .bool(3, true)
            .int64(4, i)
            .int64(5, j)
            .toByteArray();
        Proto.Reader r = new Proto.Reader(ps.call(shard, "spark_ps.Shard/Pull", req));
        Proto.Array values = null;
        while (r.next()) {
            if (r.field() == 1) {
                values = Proto.Array.parse(r.bytes());
            } else {
                r.skip();
            }
        }
        String what = "Pull [" + i + ", " + j + ") of '" + spec.name() + "' from " + shard;
        double[] v = values == null ? new double[0] : values.asDoubles(what);
        if (v.length != (j - i) * spec.cols()) {
            throw new IllegalStateException(what + ": got " + v.length + " values, expected "
                + (j - i) * spec.cols());
        }
        return v;
    }

    @Override
    public void close() {
        synchronized (this) {
            if (pool != null) {
                pool.shutdownNow();
            }
        }
        ps.close();
    }
}
