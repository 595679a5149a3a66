package io.sparkps.bridge;

/** A PS call that failed: names the RPC, the address it went to and the gRPC status. */
public class PSException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    private final String rpc;
    private final String address;
    private final String code;

    PSException(String rpc, String address, String code, String message, Throwable cause) {
        super(rpc + " to " + address + " failed: " + code + ": " + message, cause);
        this.rpc = rpc;
        this.address = address;
        this.code = code;
    }

    /** The full method name, e.g. {@code spark_ps.Shard/Pull}. */
    public String rpc() {
        return rpc;
    }

    /** The {@code host:port} the call went to. */
    public String address() {
        return address;
    }

    /** The gRPC status code name, e.g. {@code UNAUTHENTICATED}. */
    public String code() {
        return code;
    }
}
