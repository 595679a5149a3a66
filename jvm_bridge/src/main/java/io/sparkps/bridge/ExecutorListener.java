package io.sparkps.bridge;

import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.spark.scheduler.SparkListener;
import org.apache.spark.scheduler.SparkListenerApplicationEnd;
import org.apache.spark.scheduler.SparkListenerExecutorAdded;
import org.apache.spark.scheduler.SparkListenerExecutorRemoved;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Tells the PS coordinator when executors come and go, so that clocks and barriers stop
 * waiting for workers of a lost executor.
 *
 * <ul>
 *   <li>added: {@code Heartbeat(group="spark-executors", worker="executor:<id>/jvm")};</li>
 *   <li>removed (lost, killed, decommissioned): {@code RemoveWorker(group="*",
 *       worker="executor:<id>")}, which the coordinator reads as "every worker whose id starts
 *       with {@code executor:<id>/}, in every group".</li>
 * </ul>
 *
 * <p>Calls run on one background thread with retries, never on Spark's listener-bus thread.
 */
public class ExecutorListener extends SparkListener implements AutoCloseable {
    /** The group in which each live executor JVM is recorded. */
    public static final String GROUP = "spark-executors";

    private static final Logger LOG = LoggerFactory.getLogger(ExecutorListener.class);
    private static final int ATTEMPTS = 5;

    private final PSCoordinatorClient ps;
    private final ExecutorService calls;
    private final AtomicLong removedWorkers = new AtomicLong();
    private final AtomicLong failures = new AtomicLong();

    public ExecutorListener(PSCoordinatorClient ps) {
        this.ps = ps;
        this.calls = Executors.newSingleThreadExecutor(r -> {
            Thread t = new Thread(r, "spark-ps-executor-listener");
            t.setDaemon(true);
            return t;
        });
    }

    public ExecutorListener(String address, String token) {
        this(new PSCoordinatorClient(address, token, 30.0));
    }

    /** The worker-id prefix of every PS worker running in executor {@code executorId}. */
    public static String workerPrefix(String executorId) {
        return "executor:" + executorId;
    }

    @Override
    public void onExecutorAdded(SparkListenerExecutorAdded event) {
        String worker = workerPrefix(event.executorId()) + "/jvm";
        submit("Heartbeat " + worker, () -> ps.heartbeat(GROUP, worker));
    }

    @Override
    public void onExecutorRemoved(SparkListenerExecutorRemoved event) {
        String executor = workerPrefix(event.executorId());
        LOG.info("executor {} removed ({}); dropping its PS workers", event.executorId(),
            event.reason());
        submit("RemoveWorker " + executor, () -> {
            long n = ps.removeWorker("*", executor);
            removedWorkers.addAndGet(n);
            return n;
        });
    }

    @Override
    public void onApplicationEnd(SparkListenerApplicationEnd event) {
        calls.shutdown();
    }

    private interface Call {
        long run();
    }

    private Future<?> submit(String what, Call call) {
        return calls.submit(() -> {
            long backoff = 200;
            for (int attempt = 1; ; attempt++) {
                try {
                    call.run();
                    return;
                } catch (RuntimeException e) {
                    if (attempt >= ATTEMPTS) {
                        failures.incrementAndGet();
                        LOG.warn("spark-ps: {} to {} failed after {} attempts: {}", what,
                            ps.address(), attempt, e.getMessage());
                        return;
                    }
                    try {
                        Thread.sleep(backoff);
                    } catch (InterruptedException ie) {
                        Thread.currentThread().interrupt();
                        return;
                    }
                    backoff *= 2;
                }
            }
        });
    }

    /**
     * Waits until every report submitted so far has been sent (or given up).
     *
     * @return true if the queue drained within {@code timeoutSeconds}
     */
    public boolean flush(double timeoutSeconds) throws Exception {
        Future<?> marker = calls.submit(() -> { });
        try {
            marker.get((long) (timeoutSeconds * 1000), TimeUnit.MILLISECONDS);
            return true;
        } catch (java.util.concurrent.TimeoutException e) {
            return false;
        }
    }

    /** Workers the coordinator reported dropped, summed over every RemoveWorker sent. */
    public long removedWorkers() {
        return removedWorkers.get();
    }

    /** Reports given up after all retries. */
    public long failures() {
        return failures.get();
    }

    @Override
    public void close() {
        calls.shutdown();
        try {
            calls.awaitTermination(10, TimeUnit.SECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
