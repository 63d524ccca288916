#!/usr/bin/python3
"""fork() with pyverbs and Python's multiprocessing, as people write it.

usage: fork_pyverbs.py DEVICE

The parent opens DEVICE and connects two RC QPs of it to each other. Then, in children made
by multiprocessing's fork start method:
  - one closes everything it inherited (what garbage collection or an explicit close does in
    a worker): it must finish, not hang;
  - one finds that the inherited CQ cannot be polled (the parent's, fork_guard.h), then opens
    DEVICE itself and moves verified bytes between two QPs of its own.
The parent's QPs then still move verified bytes. Prints one "ok"/"not ok" line per check;
exit status 0 only if all passed.
"""
import multiprocessing
import os
import sys

import pyverbs.enums as e
from pyverbs.addr import AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.pyverbs_error import PyverbsError, PyverbsRDMAError
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, SendWR

SIZE = 65536
ACCESS = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ)


class Pair:
    """Two RC QPs of one context, connected to each other, each with a registered buffer."""

    def __init__(self, device):
        self.ctx = Context(name=device)
        self.pd = PD(self.ctx)
        self.cq = CQ(self.ctx, 64)
        cap = QPCap(max_send_wr=16, max_recv_wr=16, max_send_sge=1, max_recv_sge=1)
        init = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap)
        self.qps = [QP(self.pd, init), QP(self.pd, init)]
        self.mrs = [MR(self.pd, SIZE, ACCESS), MR(self.pd, SIZE, ACCESS)]
        gid = self.ctx.query_gid(port_num=1, index=0)
        for me, peer in ((0, 1), (1, 0)):
            attr = QPAttr(qp_state=e.IBV_QPS_INIT, cur_qp_state=e.IBV_QPS_RESET)
            attr.qp_access_flags = ACCESS
            attr.path_mtu = e.IBV_MTU_1024
            attr.dest_qp_num = self.qps[peer].qp_num
            attr.rq_psn = 0
            attr.sq_psn = 0
            attr.max_dest_rd_atomic = 1
            attr.max_rd_atomic = 1
            attr.min_rnr_timer = 1
            attr.timeout = 14
            attr.retry_cnt = 7
            attr.rnr_retry = 7
            attr.ah_attr = AHAttr(gr=GlobalRoute(dgid=gid, sgid_index=0), is_global=1,
                                  port_num=1)
            self.qps[me].to_rts(attr)

    def write_and_check(self, seed):
        """RDMA WRITE of fresh bytes from buffer 0 to buffer 1; True if they all arrived."""
        data = bytes((seed * 131 + i * 7 + (i >> 8)) & 0xff for i in range(SIZE))
        self.mrs[0].write(data, SIZE)
        self.mrs[1].write(b"\0" * SIZE, SIZE)
        wr = SendWR(opcode=e.IBV_WR_RDMA_WRITE, num_sge=1,
                    sg=[SGE(self.mrs[0].buf, SIZE, self.mrs[0].lkey)])
        wr.set_wr_rdma(self.mrs[1].rkey, self.mrs[1].buf)
        self.qps[0].post_send(wr)
        for _ in range(2_000_000):  # bounded: a few seconds at most
            n, wcs = self.cq.poll()
            if n:
                return wcs[0].status == e.IBV_WC_SUCCESS and self.mrs[1].read(SIZE, 0) == data
        return False

    def close(self):
        for o in self.qps + self.mrs + [self.cq, self.pd, self.ctx]:
            o.close()


def child_closes(pair):
    pair.close()  # the parent's objects: must return, touching nothing of the parent's


def child_uses(pair, device, out):
    try:
        pair.cq.poll()
        out.put("polling the inherited CQ did not fail")
        return
    except (PyverbsError, PyverbsRDMAError):
        pass
    own = Pair(device)
    ok = all(own.write_and_check(seed) for seed in (11, 12, 13))
    own.close()
    out.put("ok" if ok else "the child's own QPs lost or changed bytes")


def run_bounded(mp, target, args, seconds):
    """Runs target(*args) in a forked child; (hung, exit code), a hung child killed."""
    child = mp.Process(target=target, args=args)
    child.start()
    child.join(seconds)
    hung = child.is_alive()
    if hung:
        child.kill()
        child.join()
    return hung, child.exitcode


def main():
    device = sys.argv[1]
    failed = 0

    def check(label, good, detail=""):
        nonlocal failed
        print(("ok - " if good else "not ok - ") + label + ("" if good else f": {detail}"))
        failed += not good

    pair = Pair(device)
    check("parent: verified WRITE before forking", pair.write_and_check(1))
    mp = multiprocessing.get_context("fork")

    closer_hung, closer_exit = run_bounded(mp, child_closes, (pair,), 30)
    check("a child closing its inherited context ends", not closer_hung and closer_exit == 0,
          "hung" if closer_hung else f"exit code {closer_exit}")

    out = mp.Queue()
    user_hung, _ = run_bounded(mp, child_uses, (pair, device, out), 60)
    result = "no answer" if user_hung or out.empty() else out.get()
    check("a child cannot poll the inherited CQ and uses its own context", result == "ok", result)

    for seed in (2, 3):
        check(f"parent: verified WRITE after the children ({seed})", pair.write_and_check(seed))
    pair.close()
    print(f"{3 + 2 - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
