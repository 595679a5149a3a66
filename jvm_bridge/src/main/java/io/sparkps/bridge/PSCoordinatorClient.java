package io.sparkps.bridge;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;

import org.sparkproject.connect.grpc.CallOptions;
import org.sparkproject.connect.grpc.Channel;
import org.sparkproject.connect.grpc.ClientInterceptors;
import org.sparkproject.connect.grpc.ManagedChannel;
import org.sparkproject.connect.grpc.Metadata;
import org.sparkproject.connect.grpc.MethodDescriptor;
import org.sparkproject.connect.grpc.StatusRuntimeException;
import org.sparkproject.connect.grpc.netty.NettyChannelBuilder;
import org.sparkproject.connect.grpc.stub.ClientCalls;
import org.sparkproject.connect.grpc.stub.MetadataUtils;

/**
 * A connection to a running PS: the coordinator's control-plane calls, plus raw unary calls
 * to any PS address (used by {@link PSClient} for the shards).
 *
 * <p>This is the only class that touches gRPC. It uses the shaded gRPC runtime inside Spark's
 * {@code spark-connect} jar ({@code org.sparkproject.connect.grpc}) with {@code byte[]}
 * marshallers, so the bridge needs no jar of its own beyond Spark's; messages are encoded by
 * {@link Proto}. Every call carries the token in {@code x-spark-ps-token} and a deadline.
 */
public class PSCoordinatorClient implements AutoCloseable {
    /** The metadata key of the auth token (ps_server/wire.py TOKEN_KEY). */
    public static final String TOKEN_KEY = "x-spark-ps-token";

    private static final int MAX_MESSAGE_BYTES = 256 * 1024 * 1024;

    private static final MethodDescriptor.Marshaller<byte[]> RAW =
        new MethodDescriptor.Marshaller<>() {
            @Override
            public InputStream stream(byte[] value) {
                return new ByteArrayInputStream(value);
            }

            @Override
            public byte[] parse(InputStream stream) {
                try (stream) {
                    return stream.readAllBytes();
                } catch (IOException e) {
                    throw new UncheckedIOException(e);
                }
            }
        };

    private static final Map<String, MethodDescriptor<byte[], byte[]>> METHODS =
        new ConcurrentHashMap<>();

    private final String address;
    private final String token;
    private final double timeoutSeconds;
    private final Map<String, ManagedChannel> managed = new ConcurrentHashMap<>();
    private final Map<String, Channel> channels = new ConcurrentHashMap<>();

    /**
     * @param address coordinator {@code host:port}
     * @param token auth token ({@code ""} for a PS without one)
     * @param timeoutSeconds deadline of each call
     */
    public PSCoordinatorClient(String address, String token, double timeoutSeconds) {
        if (address == null || address.isBlank()) {
            throw new IllegalArgumentException("PS coordinator address is empty (spark.ps.address)");
        }
        if (!(timeoutSeconds > 0)) {
            throw new IllegalArgumentException("timeoutSeconds must be > 0, got " + timeoutSeconds);
        }
        this.address = address;
        this.token = token == null ? "" : token;
        this.timeoutSeconds = timeoutSeconds;
    }

    public PSCoordinatorClient(String address, String token) {
        this(address, token, 60.0);
    }

    public String address() {
        return address;
    }

    private Channel channel(String target) {
        return channels.computeIfAbsent(target, t -> {
            ManagedChannel ch = NettyChannelBuilder.forTarget(t)
                .usePlaintext()
                .maxInboundMessageSize(MAX_MESSAGE_BYTES)
                .build();
            managed.put(t, ch);
            Metadata md = new Metadata();
            md.put(Metadata.Key.of(TOKEN_KEY, Metadata.ASCII_STRING_MARSHALLER), token);
            return ClientInterceptors.intercept(ch, MetadataUtils.newAttachHeadersInterceptor(md));
        });
    }

    private static MethodDescriptor<byte[], byte[]> method(String fullName) {
        return METHODS.computeIfAbsent(fullName, n -> MethodDescriptor.<byte[], byte[]>newBuilder()
            .setType(MethodDescriptor.MethodType.UNARY)
            .setFullMethodName(n)
            .setRequestMarshaller(RAW)
            .setResponseMarshaller(RAW)
            .build());
    }

    /**
     * One unary call with an encoded request; returns the encoded response.
     *
     * @param target {@code host:port} (the coordinator or a shard)
     * @param fullMethod e.g. {@code spark_ps.Shard/Pull} (no leading slash)
     */
    byte[] call(String target, String fullMethod, byte[] request) {
        CallOptions options = CallOptions.DEFAULT
            .withDeadlineAfter((long) (timeoutSeconds * 1000), TimeUnit.MILLISECONDS);
        try {
            return ClientCalls.blockingUnaryCall(channel(target), method(fullMethod), options,
                request);
        } catch (StatusRuntimeException e) {
            String desc = e.getStatus().getDescription();
            throw new PSException(fullMethod, target, e.getStatus().getCode().name(),
                desc == null ? String.valueOf(e.getMessage()) : desc, e);
        }
    }

    private byte[] coordinator(String method, byte[] request) {
        return call(address, "spark_ps.Coordinator/" + method, request);
    }

    private static long ackValue(byte[] raw) {
        Proto.Reader r = new Proto.Reader(raw);
        long value = 0;
        while (r.next()) {
            if (r.field() == 1) {
                value = r.int64();
            } else {
                r.skip();
            }
        }
        return value;
    }

    private static byte[] workerRef(String group, String worker) {
        return new Proto.Writer().string(1, group).string(2, worker).toByteArray();
    }

    /**
     * Drops {@code worker} from {@code group}'s clocks and barriers. Group {@code "*"} with
     * worker {@code "executor:<id>"} drops every worker of that executor from every group.
     *
     * @return the coordinator's Ack value (workers removed)
     */
    public long removeWorker(String group, String worker) {
        return ackValue(coordinator("RemoveWorker", workerRef(group, worker)));
    }

    /** Records that {@code worker} of {@code group} is alive. */
    public long heartbeat(String group, String worker) {
        return ackValue(coordinator("Heartbeat", workerRef(group, worker)));
    }

    /** Shard addresses, index {@code i} → {@code host:port}. */
    public String[] shardMap() {
        Proto.Reader r = new Proto.Reader(coordinator("GetShardMap", new byte[0]));
        List<String> addresses = new ArrayList<>();
        while (r.next()) {
            if (r.field() == 1) {
                addresses.add(r.string());
            } else {
                r.skip();
            }
        }
        return addresses.toArray(new String[0]);
    }

    /** The registered description of model {@code name}. */
    public ModelSpec model(String name) {
        byte[] req = new Proto.Writer().string(1, name).toByteArray();
        return ModelSpec.parse(coordinator("GetModel", req));
    }

    @Override
    public void close() {
        for (ManagedChannel ch : managed.values()) {
            ch.shutdownNow();
        }
        for (ManagedChannel ch : managed.values()) {
            try {
                ch.awaitTermination(5, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                break;
            }
        }
        managed.clear();
        channels.clear();
    }

    /** The fields of {@code spark_ps.ModelSpec} that a reader of parameters needs. */
    public record ModelSpec(String name, String kind, long dim, long cols, String dtype,
            long numShards) {

        static ModelSpec parse(byte[] raw) {
            String name = "";
            String kind = "";
            String dtype = "";
            long dim = 0;
            long cols = 0;
            long numShards = 0;
            Proto.Reader r = new Proto.Reader(raw);
            while (r.next()) {
                switch (r.field()) {
                    case 1 -> name = r.string();
                    case 2 -> kind = r.string();
                    case 3 -> dim = r.int64();
                    case 4 -> cols = r.int64();
                    case 5 -> dtype = r.string();
                    case 14 -> numShards = r.int64();
                    default -> r.skip();
                }
            }
            return new ModelSpec(name, kind, dim, cols == 0 ? 1 : cols, dtype, numShards);
        }
    }
}
