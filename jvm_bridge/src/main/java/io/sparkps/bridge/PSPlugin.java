package io.sparkps.bridge;

import java.io.File;
import java.io.IOException;
import java.io.Writer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.attribute.PosixFilePermissions;
import java.security.SecureRandom;
import java.util.Base64;
import java.util.Collections;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;

import org.apache.spark.SparkConf;
import org.apache.spark.SparkContext;
import org.apache.spark.SparkEnv;
import org.apache.spark.api.plugin.DriverPlugin;
import org.apache.spark.api.plugin.ExecutorPlugin;
import org.apache.spark.api.plugin.PluginContext;
import org.apache.spark.api.plugin.SparkPlugin;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * {@code --conf spark.plugins=io.sparkps.bridge.PSPlugin}: connects a Spark application to a
 * PS and keeps the PS informed about executors.
 *
 * <p>Driver side: uses {@code spark.ps.address} / {@code spark.ps.token} (token also from the
 * {@code SPARK_PS_TOKEN} environment variable); with no address and
 * {@code spark.ps.plugin.startEmbedded} (default true) it starts {@code python -m ps_server}
 * with a random token, bound to {@code spark.ps.host} (default: loopback with a local master,
 * {@code spark.driver.host} with a cluster master), writes both back into the live SparkConf (so that
 * {@code PSContext.getOrCreate(spark)} in Python connects to it), and stops it when the
 * SparkContext stops. It registers an {@link ExecutorListener}, adds {@code SPARK_PS_ADDRESS}
 * and {@code SPARK_PS_TOKEN} to the executors' environment (so Python workers launched by
 * executors started after this point inherit them), and sends address and token to every
 * executor plugin.
 *
 * <p>Executor side: sets the system properties {@code spark.ps.address}, {@code spark.ps.token}
 * and {@code spark.ps.executorId}, and writes them (keys {@code address}, {@code token},
 * {@code executor.id}; owner-only permissions) to {@value #EXECUTOR_FILE} in each of the
 * executor's block-manager directories. Python workers see those directories as the
 * comma-separated {@code SPARK_LOCAL_DIRS} environment variable, so a worker learns its
 * executor id (for worker ids {@code executor:<id>/...}) by reading that file.
 */
public class PSPlugin implements SparkPlugin {
    /** Written in every executor local dir; Python workers find it via SPARK_LOCAL_DIRS. */
    public static final String EXECUTOR_FILE = "spark-ps-executor.properties";

    private static final Logger LOG = LoggerFactory.getLogger(PSPlugin.class);

    @Override
    public DriverPlugin driverPlugin() {
        return new Driver();
    }

    @Override
    public ExecutorPlugin executorPlugin() {
        return new Executor();
    }

    static String pythonFor(SparkConf conf) {
        for (String key : new String[] {"spark.ps.python", "spark.pyspark.driver.python",
                "spark.pyspark.python"}) {
            if (conf.contains(key)) {
                return conf.get(key);
            }
        }
        for (String env : new String[] {"PYSPARK_DRIVER_PYTHON", "PYSPARK_PYTHON"}) {
            String v = System.getenv(env);
            if (v != null && !v.isBlank()) {
                return v;
            }
        }
        return "python3";
    }

    static String newToken() {
        byte[] raw = new byte[24];
        new SecureRandom().nextBytes(raw);
        return Base64.getUrlEncoder().withoutPadding().encodeToString(raw);
    }

    /** The driver half: locate or start the PS, register the listener, hand out the address. */
    public static class Driver implements DriverPlugin {
        private EmbeddedPS embedded;
        private PSCoordinatorClient client;
        private ExecutorListener listener;
        private SparkContext sc;

        @Override
        public Map<String, String> init(SparkContext sc, PluginContext ctx) {
            this.sc = sc;
            SparkConf conf = sc.conf();
            String address = conf.get("spark.ps.address", "").trim();
            String envToken = System.getenv("SPARK_PS_TOKEN");
            String token = conf.get("spark.ps.token", envToken == null ? "" : envToken);
            if (address.isEmpty()) {
                if (!conf.getBoolean("spark.ps.plugin.startEmbedded", true)) {
                    LOG.info("spark-ps: no spark.ps.address and startEmbedded=false; idle");
                    return Collections.emptyMap();
                }
                token = token.isEmpty() ? newToken() : token;
                embedded = startEmbedded(conf, token);
                address = embedded.address();
                conf.set("spark.ps.address", address);
                conf.set("spark.ps.token", token);
            }
            client = new PSCoordinatorClient(address, token,
                conf.getDouble("spark.ps.rpcTimeout", 30.0));
            listener = new ExecutorListener(client);
            sc.addSparkListener(listener);
            sc.executorEnvs().put("SPARK_PS_ADDRESS", address);
            sc.executorEnvs().put("SPARK_PS_TOKEN", token);
            conf.set("spark.executorEnv.SPARK_PS_ADDRESS", address);
            conf.set("spark.executorEnv.SPARK_PS_TOKEN", token);
            LOG.info("spark-ps: using PS at {}{}", address, embedded != null ? " (embedded)" : "");
            Map<String, String> extra = new HashMap<>();
            extra.put("spark.ps.address", address);
            extra.put("spark.ps.token", token);
            return extra;
        }

        private static EmbeddedPS startEmbedded(SparkConf conf, String token) {
            String python = pythonFor(conf);
            int shards = conf.getInt("spark.ps.numShards",
                Math.max(1, Runtime.getRuntime().availableProcessors()));
            String host = conf.get("spark.ps.host", defaultHost(conf));
            double timeout = conf.getDouble("spark.ps.startTimeout", 60.0);
            try {
                return EmbeddedPS.start(python, host, shards, token, timeout, serviceArgs(conf));
            } catch (Exception e) {
                throw new IllegalStateException("spark-ps: could not start an embedded PS with "
                    + python + " -m ps_server (set spark.ps.address to use a running one, or "
                    + "spark.ps.python to a Python that has spark-ps installed): " + e, e);
            }
        }

        /** Where an embedded PS binds without spark.ps.host: loopback with a local master
         *  (every executor shares the driver's host), else spark.driver.host, where the
         *  executors already reach the driver (the same rule as PSContext in Python). */
        static String defaultHost(SparkConf conf) {
            if (conf.get("spark.master", "local").startsWith("local")) {
                return "127.0.0.1";
            }
            return conf.get("spark.driver.host", "127.0.0.1");
        }

        /** The spark.ps.* keys that shape the service, as {@code python -m ps_server} flags
         *  (the same keys PSContext passes to an embedded PS it starts itself). */
        static List<String> serviceArgs(SparkConf conf) {
            String[][] keys = {
                {"spark.ps.checkpointDir", "--checkpoint-dir"},
                {"spark.ps.replicas", "--replicas"},
                {"spark.ps.maxRequestMB", "--max-request-mb"},
                {"spark.ps.shardMemoryMB", "--shard-memory-mb"},
            };
            List<String> args = new ArrayList<>();
            for (String[] k : keys) {
                if (conf.contains(k[0])) {
                    args.add(k[1]);
                    args.add(conf.get(k[0]));
                }
            }
            return args;
        }

        /** The listener registered by {@link #init}, or null when the plugin is idle. */
        public ExecutorListener listener() {
            return listener;
        }

        @Override
        public void shutdown() {
            if (listener != null) {
                if (sc != null) {
                    sc.removeSparkListener(listener);
                }
                listener.close();
            }
            if (embedded != null) {
                embedded.stop(client);
            }
            if (client != null) {
                client.close();
            }
        }
    }

    /** The executor half: expose the PS address, token and executor id to this executor. */
    public static class Executor implements ExecutorPlugin {
        @Override
        public void init(PluginContext ctx, Map<String, String> extraConf) {
            String address = extraConf.getOrDefault("spark.ps.address",
                ctx.conf().get("spark.ps.address", ""));
            String token = extraConf.getOrDefault("spark.ps.token",
                ctx.conf().get("spark.ps.token", ""));
            if (address.isEmpty()) {
                return;
            }
            System.setProperty("spark.ps.address", address);
            System.setProperty("spark.ps.token", token);
            System.setProperty("spark.ps.executorId", ctx.executorID());
            Properties props = new Properties();
            props.setProperty("address", address);
            props.setProperty("token", token);
            props.setProperty("executor.id", ctx.executorID());
            SparkEnv env = SparkEnv.get();
            if (env == null) {
                return;
            }
            for (File dir : env.blockManager().diskBlockManager().localDirs()) {
                try {
                    writePrivate(dir.toPath().resolve(EXECUTOR_FILE), props);
                } catch (IOException | RuntimeException e) {
                    LOG.warn("spark-ps: cannot write {} in {}: {}", EXECUTOR_FILE, dir,
                        e.getMessage());
                }
            }
        }

        private static void writePrivate(Path target, Properties props) throws IOException {
            Path tmp = Files.createTempFile(target.getParent(), ".spark-ps", ".tmp");
            try {
                Files.setPosixFilePermissions(tmp, PosixFilePermissions.fromString("rw-------"));
            } catch (UnsupportedOperationException e) {
                // not a POSIX file system: the directory is private to the executor anyway
            }
            try (Writer w = Files.newBufferedWriter(tmp, StandardCharsets.UTF_8)) {
                props.store(w, "spark-ps: PS address of this executor");
            }
            Files.move(tmp, target, StandardCopyOption.REPLACE_EXISTING,
                StandardCopyOption.ATOMIC_MOVE);
        }
    }
}
