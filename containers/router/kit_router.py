"""kit's launcher of vLLM's router (issue 29), baked into kit's router image (containers/router/).

vllm-router's own launcher (`vllm-router`) has no flag for the router's
`api_key_validation_urls` (vllm-router 0.1.17: the Rust router takes it, the argument table does
not), which is how kit keeps the endpoint closed without giving the router the key: every request
(the admin endpoints too) must carry a key that one of the replicas accepts on /v1/models. So
this launcher parses vllm-router's own arguments with vllm-router's own table, adds kit's
repeatable --api-key-validation-url, and starts the Rust router with both.

--check parses and loads everything, then exits 0 (the image's build-time canary).
"""

from __future__ import annotations

import argparse
import sys

from vllm_router.router import policy_from_str
from vllm_router.router_args import RouterArgs
from vllm_router_rs import Router


def parse(argv: list[str]) -> tuple[dict[str, object], list[str], bool]:
    parser = argparse.ArgumentParser(prog="kit_router.py", description=__doc__)
    RouterArgs.add_cli_args(parser, use_router_prefix=False)
    parser.add_argument("--api-key-validation-url", action="append", default=[], dest="kit_validate")
    parser.add_argument("--check", action="store_true", dest="kit_check")
    ns = parser.parse_args(argv)
    validate, check = list(ns.kit_validate), bool(ns.kit_check)
    args = vars(RouterArgs.from_cli_args(ns, use_router_prefix=False))
    args.pop("mini_lb", None)
    args["policy"] = policy_from_str(str(args["policy"]))
    for key in ("prefill_policy", "decode_policy"):
        args[key] = policy_from_str(args[key]) if args[key] else None  # type: ignore[arg-type]
    args["prefill_urls"] = args["decode_urls"] = None  # no prefill/decode split here
    return args, validate, check


def main(argv: list[str]) -> int:
    args, validate, check = parse(argv)
    if validate:
        args["api_key_validation_urls"] = validate
    if check:
        print(f"kit_router: vllm-router arguments parsed; {len(validate)} validation URL(s)", flush=True)
        return 0
    Router(**args).start()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
