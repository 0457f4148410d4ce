"""pymemcache (Debian's python3-pymemcache) against a memcached-protocol server.

Usage: python3 pymemcache_client.py HOST PORT ITEM_MAX
Prints "ok N" (N checks) and exits 0, or raises with the failing check.
"""

import sys

from pymemcache.client.base import Client
from pymemcache.exceptions import MemcacheServerError, MemcacheIllegalInputError

host, port, item_max = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
c = Client((host, port), default_noreply=False, connect_timeout=5, timeout=5, allow_unicode_keys=True)
checks = 0


def check(cond, what):
    global checks
    if not cond:
        raise AssertionError(what)
    checks += 1


c.flush_all()
check(c.set("k", b"v1") is True, "set")
check(c.get("k") == b"v1", "get")
check(c.get("missing") is None, "get miss")
check(c.add("k", b"x") is False, "add on a present key is NOT_STORED")
check(c.add("n", b"1") is True, "add new")
check(c.replace("k", b"v2") is True, "replace present")
check(c.replace("nope", b"x") is False, "replace missing")
check(c.append("k", b"-a") is True and c.prepend("k", b"p-") is True, "append/prepend")
check(c.get("k") == b"p-v2-a", "append/prepend result")
many = c.get_many(["k", "n", "missing"])
check(many == {"k": b"p-v2-a", "n": b"1"}, f"get_many {many}")
value, cas = c.gets("k")
check(value == b"p-v2-a" and cas is not None, "gets")
check(c.cas("k", b"new", cas) is True, "cas with the current token")
check(c.cas("k", b"newer", cas) is False, "cas with a stale token is EXISTS")
check(c.cas("nope", b"x", cas) is None, "cas on a missing key is NOT_FOUND")
check(c.incr("n", 41) == 42 and c.decr("n", 50) == 0, "incr/decr floor at 0")
check(c.incr("nope", 1) is None, "incr missing")
check(c.touch("k", 100) is True and c.touch("nope", 100) is False, "touch")
check(c.delete("k") is True and c.delete("k") is False, "delete")
check(c.set("k", b"quiet", noreply=True) is True and c.get("k") == b"quiet", "noreply set")
c.set_many({"a": b"1", "b": b"2", "c": b"3"})
check(c.get_many(["a", "b", "c"]) == {"a": b"1", "b": b"2", "c": b"3"}, "set_many")
big = bytes(range(256)) * (item_max // 256)
check(c.set("big", big) is True and c.get("big") == big, "a value at the item limit")
try:
    c.set("toobig", big + b"x")
    check(False, "a value over the item limit must fail")
except MemcacheServerError as e:
    check(b"object too large" in str(e).encode(), f"too large error text: {e}")
check(c.get("k") == b"quiet", "the connection still works after SERVER_ERROR")
try:
    c.get("x" * 251)
    check(False, "pymemcache refuses long keys itself")
except MemcacheIllegalInputError:
    checks += 1
binary_key = "bin\u00e9"
check(c.set(binary_key, b"u") is True and c.get(binary_key) == b"u", "utf-8 key")
stats = c.stats()
for name in (b"curr_items", b"get_hits", b"get_misses", b"cmd_get", b"cmd_set", b"curr_connections", b"uptime", b"version"):
    check(name in stats, f"stats has {name}")
check(stats[b"get_hits"] >= 8, f"get_hits {stats[b'get_hits']}")
settings = c.stats("settings")
check(settings[b"item_size_max"] == item_max, "stats settings item_size_max")
check(c.version().startswith(b"1.6.18"), "version")
check(c.flush_all() is True and c.get("a") is None, "flush_all")
c.quit()
print(f"ok {checks}")
