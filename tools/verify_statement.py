#!/usr/bin/env python3
"""Check a signed ledger statement without the operator's database.

    python tools/verify_statement.py STATEMENT.json [--after EARLIER.json] [--key PUBLIC.pem]

Checks the statement's Ed25519 signature (against ``--key``, the operator's public key
from ``GET /.well-known/ledger-key``; else against the key the statement names, which
only proves it was not changed since it was signed), recomputes every entry's digest
from its fields, follows the chain from the opening head to the closing head and the
balance from the opening balance to the closing one. With ``--after``, also proves the
statement extends an earlier one: the earlier's closing head is its opening head or one
of its entries, and every entry both list is the same in both. Exit 0 when valid, 1
naming each problem found.

Standard library and ``cryptography`` only: the algorithm is
docs/concepts/ledger-statements.md, the digest the one of app/credits/chain.py.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

FORMAT = "ledger-statement-v1"
CHAIN_FORMAT = "ledger-v1"
GENESIS = "0" * 64
# Each entry's fields and their types; a digest is a string, None only if not chained.
ENTRY_FIELDS = {
    "id": int,
    "account_id": int,
    "kind": str,
    "amount_units": int,
    "balance_after_units": int,
    "generation_id": (str, type(None)),
    "reference": (str, type(None)),
    "time_micros": int,
    "previous_hash": (str, type(None)),
    "entry_hash": (str, type(None)),
}
STATEMENT_FIELDS = {
    "account_id": int,
    "opening_balance_units": int,
    "opening_hash": str,
    "closing_balance_units": int,
    "closing_hash": str,
    "entries": list,
    "key_id": str,
    "public_key": str,
    "signature": str,
}


class Invalid(Exception):
    """The statement cannot be checked further: the message says why."""


def text_field(value: str | None) -> str:
    """Write a text that may hold anything as ``LENGTH:TEXT``, or ``-`` for none."""
    return "-" if value is None else f"{len(value)}:{value}"


def entry_text(entry: dict[str, Any]) -> str:
    """Return an entry's canonical text, version 1 (as app/credits/chain.py writes it)."""
    return "|".join(
        (
            CHAIN_FORMAT,
            str(entry["id"]),
            str(entry["account_id"]),
            entry["kind"],
            str(entry["amount_units"]),
            str(entry["balance_after_units"]),
            text_field(entry["generation_id"]),
            text_field(entry["reference"]),
            str(entry["time_micros"]),
            entry["previous_hash"] or "",
        )
    )


def entry_digest(entry: dict[str, Any]) -> str:
    """Return the SHA-256 of an entry's canonical text, in hex."""
    return hashlib.sha256(entry_text(entry).encode("utf-8")).hexdigest()


def canonical_bytes(statement: dict[str, Any]) -> bytes:
    """Return what was signed: the statement without ``signature``, as canonical JSON."""
    unsigned = {name: value for name, value in statement.items() if name != "signature"}
    text = json.dumps(unsigned, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8")


def _check_types(where: str, value: Any, fields: dict[str, Any]) -> None:
    if not isinstance(value, dict):
        raise Invalid(f"{where} is not a JSON object")
    for name, kind in fields.items():
        if name not in value:
            raise Invalid(f"{where} has no {name!r}")
        field = value[name]
        if isinstance(field, bool) or not isinstance(field, kind):
            raise Invalid(f"{where}: {name!r} is not of the type it should be")


def load(path: str) -> dict[str, Any]:
    """Read a statement and check it has every field of the right type. :raise Invalid."""
    try:
        statement = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise Invalid(f"cannot read it as JSON: {error}") from None
    _check_types("the statement", statement, STATEMENT_FIELDS)
    if statement.get("format") != FORMAT:
        raise Invalid(f"its format is {statement.get('format')!r}, not {FORMAT!r}")
    if statement.get("chain_format") != CHAIN_FORMAT:
        raise Invalid(f"its chain format is {statement.get('chain_format')!r}")
    for position, entry in enumerate(statement["entries"], 1):
        _check_types(f"entry #{position}", entry, ENTRY_FIELDS)
    return statement


def _decoded(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise Invalid(f"its {what} is not base64") from None


def public_key_of(pem_path: str) -> bytes:
    """Return the raw Ed25519 public key of a PEM file. :raise Invalid."""
    try:
        key = serialization.load_pem_public_key(Path(pem_path).read_bytes())
    except (OSError, ValueError) as error:
        raise Invalid(f"cannot read the key {pem_path}: {error}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise Invalid(f"{pem_path} is not an Ed25519 public key")
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def signature_problems(statement: dict[str, Any], trusted: bytes | None) -> list[str]:
    """Return what is wrong with the statement's signature (``trusted``: the operator's key)."""
    public = _decoded(statement["public_key"], "public key")
    problems = []
    if hashlib.sha256(public).hexdigest() != statement["key_id"]:
        problems.append("its key_id is not the SHA-256 of its public key")
    if trusted is not None and public != trusted:
        given = hashlib.sha256(trusted).hexdigest()
        problems.append(
            f"it is signed with key {statement['key_id']}, not with the key given ({given})"
        )
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(
            _decoded(statement["signature"], "signature"), canonical_bytes(statement)
        )
    except (InvalidSignature, ValueError):
        problems.append(
            "its signature does not match its contents: it was changed after it was signed, "
            "or signed with another key"
        )
    return problems


def _entry_problem(entry: dict[str, Any], account_id: int, state: dict[str, Any]) -> str | None:
    """Return what is wrong with ``entry`` after the chain so far (``state``), or None."""
    name = f"entry {entry['id']}"
    if entry["account_id"] != account_id:
        return f"{name} belongs to account {entry['account_id']}, not the statement's"
    if state["last_id"] is not None and entry["id"] <= state["last_id"]:
        return f"{name} comes after entry {state['last_id']}: the entries are out of order"
    if entry["entry_hash"] is None:
        return f"{name} is not chained"
    if entry_digest(entry) != entry["entry_hash"]:
        return f"{name}: its fields do not give its digest: they were changed"
    if entry["previous_hash"] != state["previous"]:
        return (
            f"{name} was chained after {entry['previous_hash']}, not after the entry before it "
            f"({state['previous']}): an entry before it is missing or out of order"
        )
    if state["balance"] + entry["amount_units"] != entry["balance_after_units"]:
        return (
            f"{name} leaves {entry['balance_after_units']} after {state['balance']} "
            f"and {entry['amount_units']} (units)"
        )
    return None


def chain_problems(statement: dict[str, Any]) -> list[str]:
    """Return where the statement's chain or balances do not hold, in the order of its entries."""
    state = {
        "previous": statement["opening_hash"],
        "balance": statement["opening_balance_units"],
        "last_id": None,
    }
    problems = []
    for entry in statement["entries"]:
        problem = _entry_problem(entry, statement["account_id"], state)
        if problem is not None:
            problems.append(problem)
        state = {
            "previous": entry["entry_hash"],
            "balance": entry["balance_after_units"],
            "last_id": entry["id"],
        }
    if statement["closing_hash"] != state["previous"]:
        problems.append("its closing head is not its last entry's digest")
    if statement["closing_balance_units"] != state["balance"]:
        problems.append("its closing balance is not the balance its last entry left")
    return problems


def extension_problems(later: dict[str, Any], earlier: dict[str, Any]) -> list[str]:
    """Return why ``later`` does not extend ``earlier`` (each valid alone); none if it does."""
    if later["account_id"] != earlier["account_id"]:
        return ["the two statements are of different accounts"]
    problems = []
    earlier_entries = {entry["id"]: entry for entry in earlier["entries"]}
    for entry in later["entries"]:
        if entry["id"] in earlier_entries and earlier_entries[entry["id"]] != entry:
            problems.append(f"entry {entry['id']} differs from the earlier statement's")
    head = earlier["closing_hash"]
    digests = {entry["entry_hash"] for entry in later["entries"]}
    if head != later["opening_hash"] and head not in digests:
        problems.append(
            f"it does not extend the earlier statement: the earlier's closing head {head} is "
            "neither its opening head nor one of its entries' (the ledger was rewritten or cut "
            "since, or the statements do not meet)"
        )
    elif head == later["opening_hash"]:
        if later["opening_balance_units"] != earlier["closing_balance_units"]:
            problems.append("its opening balance is not the earlier statement's closing balance")
    return problems


def checked(path: str, trusted: bytes | None) -> dict[str, Any]:
    """Return the statement at ``path`` if it is valid. :raise Invalid: naming its problems."""
    statement = load(path)
    problems = signature_problems(statement, trusted) + chain_problems(statement)
    if problems:
        raise Invalid("; ".join(problems))
    return statement


def main(argv: list[str] | None = None) -> int:
    """Check the statements the arguments name; print the outcome; return the exit status."""
    parser = argparse.ArgumentParser(description="Check a signed ledger statement.")
    parser.add_argument("statement", help="the statement (JSON)")
    parser.add_argument("--after", help="an earlier statement the statement must extend")
    parser.add_argument("--key", help="the operator's public key (PEM)")
    arguments = parser.parse_args(argv)
    try:
        trusted = public_key_of(arguments.key) if arguments.key else None
        statement = _named(arguments.statement, trusted)
        extends = ""
        if arguments.after:
            earlier = _named(arguments.after, trusted)
            problems = extension_problems(statement, earlier)
            if problems:
                raise Invalid(f"{arguments.statement}: " + "; ".join(problems))
            extends = f"; it extends {arguments.after}"
    except Invalid as invalid:
        print(f"invalid: {invalid}", file=sys.stderr)
        return 1
    print(_summary(arguments.statement, statement, trusted is not None) + extends)
    return 0


def _named(path: str, trusted: bytes | None) -> dict[str, Any]:
    try:
        return checked(path, trusted)
    except Invalid as invalid:
        raise Invalid(f"{path}: {invalid}") from None


def _summary(path: str, statement: dict[str, Any], trusted: bool) -> str:
    key = "the key given" if trusted else "its own: give --key to check it is the operator's"
    return (
        f"valid: {path}: account {statement['account_id']}, {statement.get('period')}, "
        f"{len(statement['entries'])} entries, balance {statement['opening_balance_units']} "
        f"to {statement['closing_balance_units']} units, head {statement['closing_hash']}; "
        f"signed by key {statement['key_id']} ({key})"
    )


if __name__ == "__main__":
    sys.exit(main())
