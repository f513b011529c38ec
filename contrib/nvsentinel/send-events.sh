#!/bin/bash
# Send kvaudit's findings on this node to NVIDIA NVSentinel's platform connector (docs/fleet.md, "NVSentinel").
#
#   kvaudit check local --nvsentinel-events /run/kvaudit/events.json --health-check >/dev/null
#   contrib/nvsentinel/send-events.sh /run/kvaudit/events.json
#
# The file is NVSentinel's HealthEvents message in protobuf's JSON mapping (docs/schemas/
# nvsentinel-health-events.schema.json); grpcurl sends it to the connector's PlatformConnector/
# HealthEventOccurredV1 over its unix socket. The connector's container creates the socket at
# /var/run/nvsentinel.sock, with /var/run/nvsentinel of the host mounted there: on the host it is
# /var/run/nvsentinel/nvsentinel.sock. grpcurl needs the message definitions: NVSentinel's
# data-models/protobufs/health_event.proto (PROTO_DIR, the directory holding it) or the server's reflection.
#
# Environment: NVSENTINEL_SOCKET (default /var/run/nvsentinel/nvsentinel.sock), PROTO_DIR (no default: without
# it grpcurl asks the server's reflection), GRPCURL (default grpcurl).
set -euo pipefail
EVENTS="${1:?usage: send-events.sh EVENTS.json}"
SOCKET="${NVSENTINEL_SOCKET:-/var/run/nvsentinel/nvsentinel.sock}"
GRPCURL="${GRPCURL:-grpcurl}"
PROTO_ARGS=()
if [[ -n "${PROTO_DIR:-}" ]]; then
    PROTO_ARGS=(-import-path "$PROTO_DIR" -proto health_event.proto)
fi
exec "$GRPCURL" -plaintext -unix "${PROTO_ARGS[@]}" -max-time 5 -d @ "$SOCKET" \
    datamodels.PlatformConnector/HealthEventOccurredV1 < "$EVENTS"
