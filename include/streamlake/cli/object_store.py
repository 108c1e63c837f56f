"""``streamlake s3``: the local S3 API server (moto) for development and tests."""

from __future__ import annotations

from streamlake.cli.common import print_json


def cmd_s3(args) -> int:
    from streamlake.platform import object_store

    if args.action == "start":
        state = object_store.start(args.port)
        word = "already running" if state.pop("already_running") else "started"
        print(f"local S3 server {word} at {state['endpoint']} (pid {state['pid']})")
        if args.bucket:
            object_store.create_bucket(f"s3://{args.bucket}", object_store.local_options(args.port))
            print(f"bucket s3://{args.bucket} ready")
        print("export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (any values: the server checks none) and "
              "give a job its options (conditional_put=etag makes commits safe):\n  "
              + " ".join(f"--storage-option {k}={v}" for k, v in object_store.local_options(args.port).items()
                         if not k.startswith("AWS_ACCESS") and not k.startswith("AWS_SECRET")))
        return 0
    if args.action == "stop":
        print("local S3 server stopped" if object_store.stop() else "local S3 server was not running")
        return 0
    state = object_store.status()
    print_json(state)
    return 0 if state["running"] else 1


def add_parsers(sub) -> None:
    from streamlake.platform.object_store import DEFAULT_PORT

    s = sub.add_parser("s3", help="local S3 API server (moto; dev/test, memory only)")
    s.add_argument("action", choices=["start", "stop", "status"])
    s.add_argument("--port", type=int, default=DEFAULT_PORT)
    s.add_argument("--bucket", help="with start: create this bucket")
    s.set_defaults(func=cmd_s3)
