"""The store layer: reaching the external TCPStore, and riding through its restarts.

`client` connects with backoff and a deadline and scopes keys under a job's prefix. `link` holds clients
that reconnect when the server comes back, bound every call (`call_watch` cuts a call left unanswered)
and know which life of the server, its instance (`epoch:nonce`), they talk to. `server` and `main` run
the standalone server, `ftcoord-store`. What the keys mean is ftcoord.protocol's business, not this one's.
"""
