"""durable-sse: consume Server-Sent Events streams durably, orchestrated by Temporal."""

__version__ = "0.1.0"
