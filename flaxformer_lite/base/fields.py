"""The meaning of a dataclass's fields, read from the comments beside them in its source.

The config dataclasses document each field with a comment, either at the end of the field's
line or as a block of comment lines just above it::

    num_steps: int = 500  # optimizer steps
    # optimizer steps per compiled call ...
    steps_per_call: int = 1

`field_comments` returns those comments as one line per field, so that a listing of the
fields (``flaxformer-lite study --list-fields``) says what each one means without a second
copy of the text. Standard library only.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import textwrap
import tokenize


def field_comments(cls: type) -> dict[str, str]:
    """``{field: comment}`` for the dataclass ``cls`` and the dataclasses it inherits from.

    A field's comment is the one at the end of its line, continued by the comment lines right
    under it unless they are the block above a next field that has no comment at its line's
    end; else the block of comment lines directly above it; else, for a field on the line
    right under one documented by such a block, that block (a pair of fields sharing one
    comment). Lines are joined with spaces and the leading ``#`` dropped. A field without a
    comment, or a class whose source cannot be read (built in a notebook cell), maps to ``""``.
    """
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            out.update(_own_comments(klass))
    return {f.name: out.get(f.name, "") for f in dataclasses.fields(cls)}


@functools.cache
def _own_comments(cls: type) -> dict[str, str]:
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    comments: dict[int, str] = {}  # line -> its comment text
    code_lines: set[int] = set()  # lines holding something other than a comment
    skip = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
        elif token.type not in skip:
            code_lines.update(range(token.start[0], token.end[0] + 1))
    body = ast.parse(source).body[0].body
    fields = [
        (node.target.id, node.lineno, node.end_lineno)
        for node in body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    ]

    def block_above(line: int) -> list[int]:
        lines = []
        while line - 1 in comments and line - 1 not in code_lines:
            line -= 1
            lines.insert(0, line)
        return lines

    def trailing(first: int, last: int) -> list[int]:
        return [n for n in range(first, last + 1) if n in comments and n in code_lines]

    starts = {first: (first, last) for _, first, last in fields}
    out: dict[str, str] = {}
    shared: list[int] = []  # the block above the previous field, for a field right after it
    previous_last = None
    for name, first, last in fields:
        own = trailing(first, last)
        if own:
            below = []
            while last + 1 + len(below) in comments and last + 1 + len(below) not in code_lines:
                below.append(last + 1 + len(below))
            after = starts.get(last + 1 + len(below))
            if below and (after is None or trailing(*after)):  # not the next field's block
                own += below
            shared = []
        elif block_above(first):
            own = shared = block_above(first)
        elif previous_last == first - 1:  # a field right under one documented by a block
            own = shared
        out[name] = " ".join(comments[n] for n in own if comments[n])
        previous_last = last
    return out
