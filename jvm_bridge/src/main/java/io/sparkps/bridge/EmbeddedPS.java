package io.sparkps.bridge;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A PS service ({@code python -m ps_server}, or its {@code coordinator} alone with
 * {@code spark.ps.mode=executors}) started by the driver plugin and stopped with the
 * application.
 *
 * <p>The service asks Linux to stop it when the thread that started it exits
 * (PR_SET_PDEATHSIG), so it is started from a thread of its own that lives exactly as long
 * as the process; that thread also drains the service's stdout.
 */
final class EmbeddedPS {
    static final String READY_PREFIX = "SPARK_PS_READY ";
    /** What {@code ps_server coordinator} prints once it accepts hosts. */
    static final String LISTENING_PREFIX = "SPARK_PS_LISTENING ";
    private static final Logger LOG = LoggerFactory.getLogger(EmbeddedPS.class);

    private final String token;
    private final String readyPrefix;
    private final CompletableFuture<String> address = new CompletableFuture<>();
    private volatile Process process;

    private EmbeddedPS(String token, String readyPrefix) {
        this.token = token;
        this.readyPrefix = readyPrefix;
    }

    /** Starts {@code python -m ps_server} (plus {@code extraArgs}, e.g. --replicas 2) and
     *  waits for its address. */
    static EmbeddedPS start(String python, String host, int shards, String token,
            double timeoutSeconds, List<String> extraArgs) throws Exception {
        List<String> cmd = new ArrayList<>(List.of(python, "-m", "ps_server", "--host", host,
            "--port", "0", "--shards", Integer.toString(shards), "--log-level", "WARNING"));
        cmd.addAll(extraArgs);
        return launch(cmd, token, READY_PREFIX, timeoutSeconds);
    }

    /** Starts {@code python -m ps_server coordinator} (plus {@code extraArgs}) and waits
     *  until it accepts hosts, not until they joined: the executors that will run its
     *  shards are requested only after the driver plugins started. */
    static EmbeddedPS startCoordinator(String python, String host, String token,
            double timeoutSeconds, List<String> extraArgs) throws Exception {
        List<String> cmd = new ArrayList<>(List.of(python, "-m", "ps_server", "coordinator",
            "--host", host, "--port", "0", "--log-level", "WARNING"));
        cmd.addAll(extraArgs);
        return launch(cmd, token, LISTENING_PREFIX, timeoutSeconds);
    }

    private static EmbeddedPS launch(List<String> cmd, String token, String prefix,
            double timeoutSeconds) throws Exception {
        EmbeddedPS ps = new EmbeddedPS(token, prefix);
        Thread keeper = new Thread(() -> ps.run(cmd), "spark-ps-embedded");
        keeper.setDaemon(true);
        keeper.start();
        try {
            ps.address.get((long) (timeoutSeconds * 1000), TimeUnit.MILLISECONDS);
        } catch (TimeoutException e) {
            ps.stop(null);
            throw new IllegalStateException("embedded PS (" + String.join(" ", cmd)
                + ") did not report ready within " + timeoutSeconds + "s");
        }
        return ps;
    }

    private void run(List<String> cmd) {
        try {
            ProcessBuilder pb = new ProcessBuilder(cmd).redirectErrorStream(false)
                .redirectError(ProcessBuilder.Redirect.INHERIT);
            pb.environment().put("SPARK_PS_TOKEN", token);
            process = pb.start();
            try (BufferedReader out = new BufferedReader(
                    new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8))) {
                String line;
                while ((line = out.readLine()) != null) {
                    if (line.startsWith(readyPrefix) && !address.isDone()) {
                        address.complete(line.substring(readyPrefix.length()).trim());
                    }
                }
            }
            int code = process.waitFor();
            address.completeExceptionally(new IllegalStateException(
                "embedded PS exited with code " + code + " before it was ready: " + cmd));
        } catch (IOException | RuntimeException e) {
            address.completeExceptionally(e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    String address() {
        return address.getNow(null);
    }

    String token() {
        return token;
    }

    /** Asks the service to shut down (if a client is given), then terminates it. */
    void stop(PSCoordinatorClient client) {
        Process p = process;
        if (p == null || !p.isAlive()) {
            return;
        }
        try {
            if (client != null) {
                client.call(client.address(), "spark_ps.Coordinator/Shutdown", new byte[0]);
                if (p.waitFor(15, TimeUnit.SECONDS)) {
                    return;
                }
            }
        } catch (RuntimeException e) {
            LOG.warn("spark-ps: Shutdown of the embedded PS failed ({}); terminating it",
                e.getMessage());
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
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
