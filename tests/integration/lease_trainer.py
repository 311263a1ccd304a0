"""A Ray client trainer that holds a lease and does nothing else: the heartbeat alone
(test_lease_renewal.py runs it in a process of its own, as a trainer pod is).

``python lease_trainer.py ray://host:port <ray namespace> <ttl_s> <stop file>`` leases
every free env of the pool whose lease actor runs in that namespace and prints one
JSON line when leased and one when the stop file appears (then it releases).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

from remote_env import ray_connect
from remote_env.driver import attach
from remote_env.pool import lease_actor


def main(address: str, namespace: str, ttl_s: float, stop_file: str) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # a failed renewal's traceback (the heartbeat logs it at debug level)
    logging.getLogger("remote_env.driver.heartbeat").setLevel(logging.DEBUG)
    ray_connect.connect(address, wait_s=60)
    registry = lease_actor.get_lease_actor(namespace)
    holder = attach.holder()
    lease = attach._acquire(registry, "renewing", None, ttl_s, 30, holder)
    keeper = attach._LeaseKeeper(registry, lease["lease_id"], "renewing",
                                 [s.slot for s in lease["slots"]], ttl_s, lease["epoch"],
                                 holder, client_address=address, namespace=namespace)
    print(json.dumps({"lease_id": lease["lease_id"], "holder": holder}), flush=True)
    while not os.path.exists(stop_file):
        time.sleep(0.2)
    # what the old keeper had too (lost), and what it did not (reconnects): absent there
    print(json.dumps({"lost": keeper.lost, "holder": keeper.holder,
                      "reconnects": getattr(keeper, "reconnects", None)}), flush=True)
    keeper.release()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4])
