"""``python -m fastrl.node --connect HOST:PORT --node_rank K``: be sampler node K of a run
whose learner node (``train.py --num_sampler_nodes N --start_sampler_nodes False``) listens
at HOST:PORT. The node takes the run's whole configuration from the learner node; this
machine needs the same fastrl and envs installed. See docs/internals.md, "Sampler nodes".
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fastrl.node",
        description="Run a sampler node for a fastrl learner node on another machine.")
    parser.add_argument("--connect", required=True, metavar="HOST:PORT",
                        help="the learner node's address, as train.py prints it")
    parser.add_argument("--node_rank", required=True, type=int, metavar="K",
                        help="this node's number, 0 to --num_sampler_nodes - 1")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds to wait for the learner node (default 60)")
    args = parser.parse_args(argv)
    host, _, port = args.connect.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        parser.error(f"--connect={args.connect}: must be HOST:PORT, with a port 1 to 65535")

    import threading

    from fastrl.runner.link import join_store
    from fastrl.runner.sampler_node import run_node
    from fastrl.train import user_error_types
    from fastrl.transport.signals import LauncherSignals

    try:
        store = join_store(host, int(port), args.timeout)
    except (RuntimeError, OSError) as exc:
        print(f"fastrl.node: error: cannot reach the learner node at {args.connect}: "
              f"{str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    # Ctrl-C, SIGTERM or SIGHUP: the node finishes the message it is sending, stops its
    # workers and tells the learner node it leaves (its trajectories in flight are dropped and
    # counted there, as for a lost node); exit status 0. A second signal quits at once.
    stop = threading.Event()
    try:
        with LauncherSignals(on_stop=stop.set) as signals:
            run_node(store, args.node_rank, stop=stop)
    except KeyboardInterrupt:  # before the handlers were in place
        signals = None
    except (ValueError, *user_error_types()) as exc:
        print(f"fastrl.node: error: {exc}", file=sys.stderr)
        return 1
    if signals is None or signals.stopped_by is not None:
        by = signals.stopped_by if signals is not None else "SIGINT"
        print(f"fastrl.node: stopped ({by})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    from fastrl.transport.startup import exit_command

    exit_command(main())
