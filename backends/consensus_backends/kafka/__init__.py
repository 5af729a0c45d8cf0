"""Kafka backend: ``kafka://b1:9092,b2:9092/prefix`` (needs ``consensus-api[kafka]``)."""

from consensus_backends.kafka.backend import KafkaBackend

__all__ = ["KafkaBackend"]
