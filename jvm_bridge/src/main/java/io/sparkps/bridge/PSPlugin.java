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
import java.util.regex.Matcher;
import java.util.regex.Pattern;

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
 *
 * <p>{@code spark.ps.mode=executors} (with no {@code spark.ps.address}, and a master other
 * than {@code local}/{@code local[N]}): the driver side starts only the coordinator
 * ({@code python -m ps_server coordinator} on {@code spark.driver.host}), and each executor
 * side starts a shard supervisor ({@code python -m ps_server shards --join}, see
 * {@link ExecutorShards}) with the Python Spark runs Python workers with, identified as
 * {@code <executor host>/executor-<id>}. The coordinator places the partitions once
 * {@code spark.ps.numHosts} executors joined (default: the executors the configuration
 * asks for, see {@link Driver#expectedHosts}; else those that join within
 * {@code spark.ps.joinWait} seconds of each other).
 */
public class PSPlugin implements SparkPlugin {
    /** Written in every executor local dir; Python workers find it via SPARK_LOCAL_DIRS. */
    public static final String EXECUTOR_FILE = "spark-ps-executor.properties";
    /** Sent to executor plugins with spark.ps.mode=executors: their shard slots, and the
     *  Python to run the shard supervisor with. */
    static final String EXECUTOR_SHARDS = "spark.ps.executors.shards";
    static final String EXECUTOR_PYTHON = "spark.ps.executors.python";
    private static final Pattern LOCAL_CLUSTER = Pattern.compile("local-cluster\\[\\s*(\\d+)\\s*,.*");

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

    /** {@code spark.ps.mode}: {@code embedded} (default) or {@code executors}. */
    static String mode(SparkConf conf) {
        String mode = conf.get("spark.ps.mode", "embedded").trim().toLowerCase();
        if (!mode.equals("embedded") && !mode.equals("executors")) {
            throw new IllegalArgumentException("spark.ps.mode must be embedded or executors, got "
                + conf.get("spark.ps.mode"));
        }
        return mode;
    }

    /** {@code local} / {@code local[N]}: every task runs in the driver's JVM, so an embedded
     *  PS serves them (local-cluster has executors of its own). */
    static boolean isPlainLocal(SparkConf conf) {
        String master = conf.get("spark.master", "local");
        return master.equals("local") || master.startsWith("local[");
    }

    /** The Python Spark runs Python workers with (as pyspark picks it): executors' shards run
     *  in it, so {@code --archives env.tar.gz#env} with {@code PYSPARK_PYTHON=./env/bin/python}
     *  works for them too. */
    static String workerPython(SparkConf conf) {
        if (conf.contains("spark.ps.executorPython")) {
            return conf.get("spark.ps.executorPython");
        }
        if (conf.contains("spark.pyspark.python")) {
            return conf.get("spark.pyspark.python");
        }
        String v = System.getenv("PYSPARK_PYTHON");
        return v != null && !v.isBlank() ? v : "python3";
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
            String mode = mode(conf);
            boolean inExecutors = false;
            if (address.isEmpty()) {
                if (!conf.getBoolean("spark.ps.plugin.startEmbedded", true)) {
                    LOG.info("spark-ps: no spark.ps.address and startEmbedded=false; idle");
                    return Collections.emptyMap();
                }
                token = token.isEmpty() ? newToken() : token;
                inExecutors = mode.equals("executors") && !isPlainLocal(conf);
                embedded = inExecutors ? startCoordinator(conf, token) : startEmbedded(conf, token);
                address = embedded.address();
                conf.set("spark.ps.address", address);
                conf.set("spark.ps.token", token);
            } else if (mode.equals("executors")) {
                LOG.warn("spark-ps: spark.ps.address={} names a running service: "
                    + "spark.ps.mode=executors starts no shards", address);
            }
            client = new PSCoordinatorClient(address, token,
                conf.getDouble("spark.ps.rpcTimeout", 30.0));
            listener = new ExecutorListener(client);
            sc.addSparkListener(listener);
            sc.executorEnvs().put("SPARK_PS_ADDRESS", address);
            sc.executorEnvs().put("SPARK_PS_TOKEN", token);
            conf.set("spark.executorEnv.SPARK_PS_ADDRESS", address);
            conf.set("spark.executorEnv.SPARK_PS_TOKEN", token);
            LOG.info("spark-ps: using PS at {}{}", address, embedded == null ? "" : inExecutors
                ? " (coordinator here, shards beside the executors)" : " (embedded)");
            Map<String, String> extra = new HashMap<>();
            extra.put("spark.ps.address", address);
            extra.put("spark.ps.token", token);
            if (inExecutors) {
                extra.put(EXECUTOR_SHARDS, Integer.toString(executorShards(conf)));
                extra.put(EXECUTOR_PYTHON, workerPython(conf));
                extra.put("spark.ps.shardMemoryMB", conf.get("spark.ps.shardMemoryMB", "0"));
            }
            return extra;
        }

        /** {@code spark.ps.mode=executors}: the coordinator alone, on the address executors
         *  reach the driver at; the executors' plugins start the shards. */
        private static EmbeddedPS startCoordinator(SparkConf conf, String token) {
            String python = pythonFor(conf);
            String host = conf.get("spark.ps.host", defaultHost(conf));
            double timeout = conf.getDouble("spark.ps.startTimeout", 60.0);
            List<String> args = coordinatorArgs(conf);
            try {
                EmbeddedPS ps = EmbeddedPS.startCoordinator(python, host, token, timeout, args);
                LOG.info("spark-ps: spark.ps.mode=executors: coordinator at {} ({})",
                    ps.address(), String.join(" ", args));
                return ps;
            } catch (Exception e) {
                throw new IllegalStateException("spark-ps: could not start the PS coordinator "
                    + "(spark.ps.mode=executors) with " + python + " -m ps_server coordinator "
                    + "(set spark.ps.python to a Python that has spark-ps installed): " + e, e);
            }
        }

        /** Flags of the coordinator: how many executors' hosts to wait for (see
         *  {@link #expectedHosts}), partitions, replicas, checkpoints, request limit, the
         *  status page's port. */
        static List<String> coordinatorArgs(SparkConf conf) {
            int replicas = conf.getInt("spark.ps.replicas", 1);
            int hosts = expectedHosts(conf);
            List<String> args = new ArrayList<>();
            args.add("--min-hosts");
            args.add(Integer.toString(Math.max(hosts, replicas)));
            if (hosts == 0) {  // unknown: the executors that join soon after the first ones
                args.add("--join-wait");
                args.add(conf.get("spark.ps.joinWait", "5"));
            }
            args.add("--replicas");
            args.add(Integer.toString(replicas));
            if (conf.contains("spark.ps.numShards")) {
                args.add("--partitions");
                args.add(conf.get("spark.ps.numShards"));
            }
            for (String[] k : new String[][] {
                    {"spark.ps.checkpointDir", "--checkpoint-dir"},
                    {"spark.ps.maxRequestMB", "--max-request-mb"},
                    {"spark.ps.uiPort", "--ui-port"}}) {
                if (conf.contains(k[0])) {
                    args.add(k[1]);
                    args.add(conf.get(k[0]));
                }
            }
            return args;
        }

        /** The executors the application will have, when the configuration says so:
         *  {@code spark.ps.numHosts}; N of {@code local-cluster[N,C,M]};
         *  {@code spark.executor.instances} without dynamic allocation;
         *  {@code spark.cores.max / spark.executor.cores}; else 0 (not known). */
        static int expectedHosts(SparkConf conf) {
            if (conf.contains("spark.ps.numHosts")) {
                int n = conf.getInt("spark.ps.numHosts", 0);
                if (n < 1) {
                    throw new IllegalArgumentException(
                        "spark.ps.numHosts must be >= 1, got " + conf.get("spark.ps.numHosts"));
                }
                return n;
            }
            Matcher m = LOCAL_CLUSTER.matcher(conf.get("spark.master", ""));
            if (m.matches()) {
                return Integer.parseInt(m.group(1));
            }
            boolean dynamic = conf.getBoolean("spark.dynamicAllocation.enabled", false);
            if (!dynamic && conf.contains("spark.executor.instances")) {
                return Math.max(0, conf.getInt("spark.executor.instances", 0));
            }
            if (!dynamic && conf.contains("spark.cores.max")
                    && conf.contains("spark.executor.cores")) {
                return conf.getInt("spark.cores.max", 0) / conf.getInt("spark.executor.cores", 1);
            }
            return 0;
        }

        /** Shard slots per executor: {@code spark.ps.executorShards}, else the executor's
         *  cores (shards are processes beside the executor, not tasks: no slot is taken). */
        static int executorShards(SparkConf conf) {
            int n = conf.getInt("spark.ps.executorShards", conf.getInt("spark.executor.cores", 1));
            if (n < 1) {
                throw new IllegalArgumentException("spark.ps.executorShards must be >= 1, got " + n);
            }
            return n;
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
        private ExecutorShards shards;

        @Override
        public void shutdown() {
            if (shards != null) {
                shards.stop();
            }
        }

        /** spark.ps.mode=executors: a shard supervisor beside this executor, identified by
         *  its host address and executor id (several executors may share a host). */
        private void startShards(PluginContext ctx, Map<String, String> extraConf,
                String address, String token) {
            SparkEnv env = SparkEnv.get();  // the executor's address, as its block manager has it
            String host = env != null ? env.blockManager().blockManagerId().host()
                : System.getenv().getOrDefault("SPARK_LOCAL_IP", "127.0.0.1");
            List<String> args = new ArrayList<>();
            String memory = extraConf.getOrDefault("spark.ps.shardMemoryMB", "0");
            if (!memory.equals("0")) {
                args.add("--shard-memory-mb");
                args.add(memory);
            }
            shards = ExecutorShards.start(extraConf.get(EXECUTOR_PYTHON), address, host,
                host + "/executor-" + ctx.executorID(),
                Integer.parseInt(extraConf.get(EXECUTOR_SHARDS)), token, args);
        }

        @Override
        public void init(PluginContext ctx, Map<String, String> extraConf) {
            String address = extraConf.getOrDefault("spark.ps.address",
                ctx.conf().get("spark.ps.address", ""));
            String token = extraConf.getOrDefault("spark.ps.token",
                ctx.conf().get("spark.ps.token", ""));
            if (address.isEmpty()) {
                return;
            }
            if (extraConf.containsKey(EXECUTOR_SHARDS)) {
                startShards(ctx, extraConf, address, token);
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
