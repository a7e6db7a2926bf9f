"""What a replica of `edgekit serve` does around the model (edgekit.serve.replica): each request's checks (a bad one
gets a 4xx and never reaches the model), the pool that joins Serve's batches into model calls, and a batch answered
in length-sorted sub-batches. No Ray, no torch: the replica and the tests import it alone.
"""

from __future__ import annotations

import asyncio


class BadRequest(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def check_item(body: object, intents: list[str], limit: int, field_name: str = "text", decoding: bool = True,
               answerable: set[str] | None = None) -> dict:
    """A /predict body (or one /predict_batch text, its `text` set) -> the item a replica answers; BadRequest
    names the field (`field_name`). decoding: the package's graph takes an intent mask. answerable: the intents
    the graph can choose (docs/package-format.md R14; None: all)."""
    if not isinstance(body, dict):
        raise BadRequest(400, "the body must be a JSON object")
    text = body.get("text")
    if not isinstance(text, str):
        raise BadRequest(422, f"{field_name}: required, a string")
    if len(text) > limit:
        raise BadRequest(413, f"{field_name}: {len(text)} characters, the limit is {limit}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # JSON may carry a lone surrogate ("\ud800"), which is no text
        raise BadRequest(422, f"{field_name}: not valid Unicode (a lone surrogate)") from None
    allow = body.get("allow_intents")
    if allow is not None and not decoding:
        raise BadRequest(422, "allow_intents: this package's graph has no intent mask (built without decoding)")
    if allow is not None:
        if not isinstance(allow, list) or not all(isinstance(a, str) for a in allow):
            raise BadRequest(422, "allow_intents: a list of intent names")
        if not allow:
            raise BadRequest(422, "allow_intents: empty (no intent could answer)")
        unknown = [a for a in allow if a not in intents]
        if unknown:
            raise BadRequest(422, f"allow_intents: unknown intent {unknown[0]!r}; known: {', '.join(intents)}")
        from edgekit.runtime.predictor import check_answerable  # the replica has it loaded already

        try:
            check_answerable("allow_intents", allow, answerable)
        except ValueError as e:
            raise BadRequest(422, str(e)) from None
    reject = body.get("reject", True)
    if not isinstance(reject, bool):
        raise BadRequest(422, "reject: true or false")
    return {"text": text, "allow_intents": allow, "reject": reject}


class Pool:
    """The items of the batches Serve formed, answered by one model call at a time; each call takes up to max_batch
    of the oldest. Serve forms a batch per wait window even while the model is busy, and those batches wait their
    turn, so under load they would stay a few items each (mean 2.4 under `high`, docs/experiments.md). Joined in
    one pool, the model's batches grow with the backlog. run: async, items -> their answers, in order."""

    def __init__(self, max_batch: int, run):
        self.max_batch, self.run = max_batch, run
        self.items: list[tuple[dict, asyncio.Future]] = []  # oldest first
        self.lock = asyncio.Lock()  # one model call at a time

    async def answer(self, items: list[dict]) -> list:
        loop = asyncio.get_running_loop()
        mine = [loop.create_future() for _ in items]
        self.items += zip(items, mine)
        while not all(f.done() for f in mine):
            async with self.lock:
                if all(f.done() for f in mine):  # a call made while we waited took them
                    break
                take, self.items = self.items[:self.max_batch], self.items[self.max_batch:]
                try:
                    outs = await self.run([i for i, _ in take])
                except BaseException:  # cancelled mid-call: the next call answers them
                    self.items[:0] = take
                    raise
                for (_, f), out in zip(take, outs):
                    f.set_result(out)
        return [f.result() for f in mine]


def in_calls(items: list[dict], sub_batch: int, predict_batch) -> list[dict]:
    """The answers to `items`, in order: one predict_batch call, or with sub_batch N < len(items) the items sorted by
    length (characters: no tokenizing twice) in calls of at most N, so each call pads to a nearer longest one."""
    n = sub_batch or len(items)
    order = sorted(range(len(items)), key=lambda k: len(items[k]["text"])) if n < len(items) else range(len(items))
    answers = [None] * len(items)
    for i in range(0, len(items), n):
        part = [items[k] for k in order[i:i + n]]
        outs = predict_batch([it["text"] for it in part], [it["allow_intents"] for it in part],
                             [it["reject"] for it in part])
        for k, out in zip(order[i:i + n], outs):
            answers[k] = out
    return answers
