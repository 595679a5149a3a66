package io.sparkps.bridge;

import java.io.ByteArrayOutputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

/**
 * The few protobuf encodings the bridge needs (ps_server/proto/ps.proto), written by hand.
 *
 * <p>Only varint (int64, bool, enum), length-delimited (string, bytes, message, packed) and
 * fixed64 (double) wire types occur in ps.proto; proto3 defaults are not written.
 */
final class Proto {
    private Proto() {}

    private static final int VARINT = 0;
    private static final int FIXED64 = 1;
    private static final int LEN = 2;
    private static final int FIXED32 = 5;

    /** Builds one message. */
    static final class Writer {
        private final ByteArrayOutputStream out = new ByteArrayOutputStream();

        private void varint(long v) {
            while ((v & ~0x7FL) != 0) {
                out.write((int) ((v & 0x7F) | 0x80));
                v >>>= 7;
            }
            out.write((int) v);
        }

        private void tag(int field, int wire) {
            varint(((long) field << 3) | wire);
        }

        Writer int64(int field, long v) {
            if (v != 0) {
                tag(field, VARINT);
                varint(v);
            }
            return this;
        }

        Writer bool(int field, boolean v) {
            return int64(field, v ? 1 : 0);
        }

        Writer bytes(int field, byte[] v) {
            if (v != null && v.length > 0) {
                tag(field, LEN);
                varint(v.length);
                out.write(v, 0, v.length);
            }
            return this;
        }

        Writer string(int field, String v) {
            return v == null ? this : bytes(field, v.getBytes(StandardCharsets.UTF_8));
        }

        /** An embedded message, written even when empty (presence matters for messages). */
        Writer message(int field, byte[] v) {
            tag(field, LEN);
            varint(v.length);
            out.write(v, 0, v.length);
            return this;
        }

        byte[] toByteArray() {
            return out.toByteArray();
        }
    }

    /** Walks the fields of one message: {@code while (r.next()) switch (r.field()) ...}. */
    static final class Reader {
        private final byte[] buf;
        private int pos;
        private final int end;
        private int field;
        private int wire;

        Reader(byte[] buf) {
            this(buf, 0, buf.length);
        }

        private Reader(byte[] buf, int start, int end) {
            this.buf = buf;
            this.pos = start;
            this.end = end;
        }

        boolean next() {
            if (pos >= end) {
                return false;
            }
            long key = varint();
            field = (int) (key >>> 3);
            wire = (int) (key & 7);
            return true;
        }

        int field() {
            return field;
        }

        private long varint() {
            long v = 0;
            for (int shift = 0; shift < 64; shift += 7) {
                if (pos >= end) {
                    throw new IllegalStateException("truncated varint in protobuf message");
                }
                byte b = buf[pos++];
                v |= (long) (b & 0x7F) << shift;
                if ((b & 0x80) == 0) {
                    return v;
                }
            }
            throw new IllegalStateException("malformed varint in protobuf message");
        }

        long int64() {
            return varint();
        }

        boolean bool() {
            return varint() != 0;
        }

        double float64() {
            long bits = 0;
            for (int i = 0; i < 8; i++) {
                bits |= (long) (buf[pos + i] & 0xFF) << (8 * i);
            }
            pos += 8;
            return Double.longBitsToDouble(bits);
        }

        byte[] bytes() {
            int n = (int) varint();
            if (n < 0 || pos + n > end) {
                throw new IllegalStateException("truncated length-delimited protobuf field");
            }
            byte[] out = new byte[n];
            System.arraycopy(buf, pos, out, 0, n);
            pos += n;
            return out;
        }

        String string() {
            return new String(bytes(), StandardCharsets.UTF_8);
        }

        /** A repeated int64, packed (proto3 default) or not. */
        void int64s(List<Long> into) {
            if (wire == LEN) {
                int n = (int) varint();
                Reader inner = new Reader(buf, pos, pos + n);
                while (inner.pos < inner.end) {
                    into.add(inner.varint());
                }
                pos += n;
            } else {
                into.add(varint());
            }
        }

        void skip() {
            switch (wire) {
                case VARINT -> varint();
                case FIXED64 -> pos += 8;
                case LEN -> {
                    int n = (int) varint();  // read the length before moving pos
                    pos += n;
                }
                case FIXED32 -> pos += 4;
                default -> throw new IllegalStateException("unsupported protobuf wire type " + wire);
            }
        }
    }

    /** A decoded {@code spark_ps.Array}: raw bytes, dtype name and shape. */
    static final class Array {
        byte[] data = new byte[0];
        String dtype = "";
        final List<Long> shape = new ArrayList<>();

        static Array parse(byte[] raw) {
            Array a = new Array();
            Reader r = new Reader(raw);
            while (r.next()) {
                switch (r.field()) {
                    case 1 -> a.data = r.bytes();
                    case 2 -> a.dtype = r.string();
                    case 3 -> r.int64s(a.shape);
                    default -> r.skip();
                }
            }
            return a;
        }

        /** The values as doubles (float64 or float32 payloads). */
        double[] asDoubles(String what) {
            return switch (dtype) {
                case "float64" -> LittleEndian.doubles(data, what);
                case "float32" -> LittleEndian.floatsAsDoubles(data, what);
                default -> throw new IllegalStateException(
                    what + ": expected float64 or float32 values, got dtype '" + dtype + "'");
            };
        }
    }
}
