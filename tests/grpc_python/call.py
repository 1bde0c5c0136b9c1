"""One gRPC call made by grpc-python (grpcio), the way an independent client makes it.

usage: call.py SOCKET METHOD AUTHORITY REQUEST_HEX [stream]

AUTHORITY is `default` (grpc-python's own choice for a `unix:` target: the percent-encoded
socket path since 1.57), `path` (the socket path, as the kubelet's plugin watcher sends it) or
`localhost`. Prints the response message in hex (the first message of a server stream), or
`error CODE DETAILS` and exits 1.
"""

import sys

import grpc


def main() -> int:
    socket, method, authority, request_hex = sys.argv[1:5]
    streaming = len(sys.argv) > 5 and sys.argv[5] == "stream"
    options = []
    if authority == "path":
        options.append(("grpc.default_authority", socket))
    elif authority == "localhost":
        options.append(("grpc.default_authority", "localhost"))
    elif authority != "default":
        raise SystemExit(f"unknown authority mode {authority!r}: default, path or localhost")
    request = bytes.fromhex(request_hex)
    with grpc.insecure_channel("unix:" + socket, options=options) as channel:
        try:
            if streaming:
                call = channel.unary_stream(method)(request, timeout=20)
                first = next(iter(call))
                call.cancel()
                print(first.hex())
            else:
                print(channel.unary_unary(method)(request, timeout=20).hex())
        except grpc.RpcError as error:
            print(f"error {error.code()} {error.details()}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
