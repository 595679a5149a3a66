package io.sparkps.bridge;

import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * {@code python -m ps_server shards --join COORDINATOR} beside one executor JVM
 * ({@code spark.ps.mode=executors}): the supervisor that runs the PS shards the coordinator
 * places on this executor.
 *
 * <p>It dies with its executor: it is started from a thread that lives as long as the JVM
 * and asks Linux to SIGTERM it when that thread's process is gone (PR_SET_PDEATHSIG, set by
 * the supervisor itself), and its shards die with it the same way. A SIGKILLed executor
 * therefore leaves no shard behind; the coordinator sees the host's heartbeats stop and
 * recovers its partitions as for any lost host. Its output goes to the executor's stderr.
 */
final class ExecutorShards {
    private static final Logger LOG = LoggerFactory.getLogger(ExecutorShards.class);

    private final List<String> cmd;
    private volatile Process process;
    private volatile boolean stopped;

    private ExecutorShards(List<String> cmd) {
        this.cmd = cmd;
    }

    /** Starts the supervisor; returns at once (it joins the coordinator on its own). */
    static ExecutorShards start(String python, String join, String host, String hostId,
            int shards, String token, List<String> extraArgs) {
        List<String> cmd = new ArrayList<>(List.of(python, "-m", "ps_server", "shards",
            "--join", join, "--host", host, "--host-id", hostId,
            "--shards", Integer.toString(shards), "--log-level", "WARNING"));
        cmd.addAll(extraArgs);
        ExecutorShards s = new ExecutorShards(cmd);
        Thread keeper = new Thread(() -> s.run(token), "spark-ps-executor-shards");
        keeper.setDaemon(true);
        keeper.start();
        return s;
    }

    private void run(String token) {
        try {
            ProcessBuilder pb = new ProcessBuilder(cmd).inheritIO()
                .redirectInput(ProcessBuilder.Redirect.PIPE);
            pb.environment().put("SPARK_PS_TOKEN", token);
            Process p = pb.start();
            process = p;
            if (stopped) {  // stop() ran before the process existed
                p.destroy();
            }
            LOG.info("spark-ps: shard supervisor started (pid {}): {}", p.pid(), cmd);
            int code = p.waitFor();
            if (code != 0) {
                LOG.warn("spark-ps: shard supervisor exited with code {}: {}", code, cmd);
            }
        } catch (IOException | RuntimeException e) {
            LOG.error("spark-ps: cannot start the shard supervisor {}: {}", cmd, e.toString());
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    /** Stops the supervisor (SIGTERM: it stops its shards), SIGKILL after 10 s. */
    void stop() {
        stopped = true;
        Process p = process;
        if (p == null || !p.isAlive()) {
            return;
        }
        p.destroy();
        try {
            if (!p.waitFor(10, TimeUnit.SECONDS)) {
                p.destroyForcibly();
            }
        } catch (InterruptedException e) {
            p.destroyForcibly();
            Thread.currentThread().interrupt();
        }
    }
}
