"""Background work: a keyed work queue with rate-limited requeue, and the backoff it
and the API clients use. Standard library only; every layer above may use it."""
