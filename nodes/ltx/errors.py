"""The pack's one error type: every bad input names where it came from, what was found and what was expected."""
from __future__ import annotations


class LTX25Error(ValueError):
    """`<where>: <what> is <found>, expected <expected>. <hint>`

    `where` is a file path or a node input; `hint` says what to do about it.
    """

    def __init__(self, where: object, what: str, found: object, expected: object, hint: str = "") -> None:
        self.where, self.what, self.found, self.expected, self.hint = str(where), what, found, expected, hint
        message = f"{where}: {what} is {found}, expected {expected}."
        if hint:
            message += f" {hint}"
        super().__init__(message)
