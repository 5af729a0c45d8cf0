"""consensus-redis: the Redis backend of consensus-api (``redis://host:6379/prefix``)."""

from consensus_redis.backend import RedisBackend

__all__ = ["RedisBackend"]
__version__ = "0.1.0"
