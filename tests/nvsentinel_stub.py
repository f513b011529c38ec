"""A stand-in for NVSentinel's platform connector, built from its published event definition: the messages of
NVIDIA/NVSentinel data-models/protobufs/health_event.proto at commit d87e98588030e23f81a64d3f747bd46dd3efd7a2,
declared here field by field (name, number, type, label) as protoc would compile them, and read with protobuf's
own JSON parser: what ``grpcurl -d @`` does to kvaudit's events before they go over the wire. The parser rejects
a field name the proto does not have, an enum name it does not define, a wrong type and a malformed timestamp."""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory, timestamp_pb2

F = descriptor_pb2.FieldDescriptorProto
PACKAGE = "datamodels"

#: message -> [(field, number, type, label, type_name)], as in health_event.proto
MESSAGES: dict[str, list[tuple[str, int, int, int, str]]] = {
    "Entity": [("entityType", 1, F.TYPE_STRING, F.LABEL_OPTIONAL, ""),
               ("entityValue", 2, F.TYPE_STRING, F.LABEL_OPTIONAL, "")],
    "BehaviourOverrides": [("force", 1, F.TYPE_BOOL, F.LABEL_OPTIONAL, ""),
                           ("skip", 2, F.TYPE_BOOL, F.LABEL_OPTIONAL, "")],
    "HealthEvent": [
        ("version", 1, F.TYPE_UINT32, F.LABEL_OPTIONAL, ""),
        ("agent", 2, F.TYPE_STRING, F.LABEL_OPTIONAL, ""),
        ("componentClass", 3, F.TYPE_STRING, F.LABEL_OPTIONAL, ""),
        ("checkName", 4, F.TYPE_STRING, F.LABEL_OPTIONAL, ""),
        ("isFatal", 5, F.TYPE_BOOL, F.LABEL_OPTIONAL, ""),
        ("isHealthy", 6, F.TYPE_BOOL, F.LABEL_OPTIONAL, ""),
        ("message", 7, F.TYPE_STRING, F.LABEL_OPTIONAL, ""),
        ("recommendedAction", 8, F.TYPE_ENUM, F.LABEL_OPTIONAL, ".datamodels.RecommendedAction"),
        ("errorCode", 9, F.TYPE_STRING, F.LABEL_REPEATED, ""),
        ("entitiesImpacted", 10, F.TYPE_MESSAGE, F.LABEL_REPEATED, ".datamodels.Entity"),
        ("metadata", 11, F.TYPE_MESSAGE, F.LABEL_REPEATED, ".datamodels.HealthEvent.MetadataEntry"),
        ("generatedTimestamp", 12, F.TYPE_MESSAGE, F.LABEL_OPTIONAL, ".google.protobuf.Timestamp"),
        ("nodeName", 13, F.TYPE_STRING, F.LABEL_OPTIONAL, ""),
        ("quarantineOverrides", 14, F.TYPE_MESSAGE, F.LABEL_OPTIONAL, ".datamodels.BehaviourOverrides"),
        ("drainOverrides", 15, F.TYPE_MESSAGE, F.LABEL_OPTIONAL, ".datamodels.BehaviourOverrides"),
        ("processingStrategy", 16, F.TYPE_ENUM, F.LABEL_OPTIONAL, ".datamodels.ProcessingStrategy"),
        ("id", 17, F.TYPE_STRING, F.LABEL_OPTIONAL, ""),
        ("customRecommendedAction", 18, F.TYPE_STRING, F.LABEL_OPTIONAL, ""),
    ],
    "HealthEvents": [("version", 1, F.TYPE_UINT32, F.LABEL_OPTIONAL, ""),
                     ("events", 2, F.TYPE_MESSAGE, F.LABEL_REPEATED, ".datamodels.HealthEvent")],
}
ENUMS = {
    "RecommendedAction": [("NONE", 0), ("COMPONENT_RESET", 2), ("CONTACT_SUPPORT", 5), ("RUN_FIELDDIAG", 6),
                          ("RESTART_VM", 15), ("RESTART_BM", 24), ("REPLACE_VM", 25), ("RUN_DCGMEUD", 26),
                          ("CUSTOM", 27), ("REMEDIATE", 28), ("UNKNOWN", 99)],
    "ProcessingStrategy": [("UNSPECIFIED", 0), ("EXECUTE_REMEDIATION", 1), ("STORE_ONLY", 2)],
}


def _file() -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto(name="health_event.proto", package=PACKAGE, syntax="proto3",
                                            dependency=["google/protobuf/timestamp.proto"])
    for name, values in ENUMS.items():
        e = fd.enum_type.add(name=name)
        for v, n in values:
            e.value.add(name=v, number=n)
    for name, fields in MESSAGES.items():
        m = fd.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label, json_name=fname)
            if type_name:
                f.type_name = type_name
        if name == "HealthEvent":  # map<string, string> metadata = 11: protoc's nested MetadataEntry
            entry = m.nested_type.add(name="MetadataEntry")
            entry.options.map_entry = True
            entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL, json_name="key")
            entry.field.add(name="value", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL, json_name="value")
    return fd


def _classes() -> dict[str, Any]:
    pool = descriptor_pool.DescriptorPool()
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(timestamp_pb2.DESCRIPTOR.serialized_pb))
    pool.Add(_file())
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{n}")) for n in MESSAGES}


CLASSES = _classes()


def receive(text: str) -> Any:
    """The platform connector's side: kvaudit's JSON parsed into ``HealthEvents`` (strict), sent as bytes over
    the wire and read back, as HealthEventOccurredV1 would receive it. Raises json_format.ParseError."""
    msg = json_format.Parse(text, CLASSES["HealthEvents"](), ignore_unknown_fields=False)
    return CLASSES["HealthEvents"].FromString(msg.SerializeToString())


def enum_name(enum: str, number: int) -> str:
    return next(n for n, v in ENUMS[enum] if v == number)
