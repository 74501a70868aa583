"""The gateway's errors, in the one tree (`fleetfence.errors`)."""

from __future__ import annotations

from fleetfence.errors import ContractError


class MqttProtocolError(ContractError):
    """A device broke the MQTT protocol; `code` is the MQTT 5 reason its connection is closed with
    (also the label the refusal is counted under); 0x81 is "Malformed Packet"."""

    def __init__(self, detail: str, code: int = 0x81) -> None:
        super().__init__("mqtt_protocol", detail)
        self.code = code


# The tracker protocols' codecs (gateway.protocols).

# Reasons after which the stream cannot go on: its framing is lost, or it has no identity.
FATAL_REASONS = frozenset({"bad_imei", "bad_preamble", "too_large", "truncated"})


class TeltonikaFrameError(ContractError):
    """A device sent something the protocol does not allow. `reason` is a short code, the label it
    is counted and dead-lettered under: bad_imei, bad_preamble, too_large, truncated (the stream
    ended or a frame stops short), bad_length (the data field's length disagrees with its
    content), bad_crc, unknown_codec, count_mismatch (the two record counts differ); from
    `to_telemetry`, no_fix (a record without a position) or the contract's `DlqReason`. `fatal` says
    the connection cannot go on."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(reason, detail)
        self.detail = detail

    @property
    def fatal(self) -> bool:
        return self.reason in FATAL_REASONS


class OsmAndRequestError(ContractError):
    """A request that carries no usable fix; `reason` is a `DlqReason` value where one fits
    (missing_field, wrong_type, not_finite, bad_timestamp, not_json, not_object, too_large,
    out_of_range, ts_in_future), else bad_device_id or no_fix (`to_telemetry`)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(reason, detail)
        self.detail = detail


class OwnTracksMessageError(ContractError):
    """A message that is not OwnTracks JSON, or a location without a usable fix; `reason` is a
    `DlqReason` value (bad_topic, too_large, not_json, not_object, missing_field, wrong_type,
    not_finite, bad_timestamp, out_of_range, ts_in_future...)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(reason, detail)
        self.detail = detail


class HttpRequestTooLargeError(ContractError):
    """A phone's request over the edge's bounds (its head, its body, requests pipelined ahead):
    raised from the HTTP parser's callbacks (gateway.http_edge), answered 413 and the connection
    closed."""

    def __init__(self, detail: str) -> None:
        super().__init__("too_large", detail)
        self.detail = detail
