import random

from edgekit.modeling.training import epoch_batches


def _padded(batches, lengths):
    return sum(max(lengths[i] for i in b) * len(b) for b in batches)


def test_epoch_batches_cover_every_example_once_and_respect_steps():
    batches = list(epoch_batches(103, 8, 100, random.Random(0)))
    assert sorted(i for b in batches for i in b) == list(range(103))
    assert len(list(epoch_batches(103, 8, 5, random.Random(0)))) == 5


def test_length_grouped_batches_pad_less_and_still_shuffle():
    rng = random.Random(1)
    lengths = [rng.randint(3, 40) for _ in range(2000)]
    plain = list(epoch_batches(2000, 32, 10_000, random.Random(0)))
    grouped = list(epoch_batches(2000, 32, 10_000, random.Random(0), lengths, pool=10))
    assert sorted(i for b in grouped for i in b) == list(range(2000))
    assert all(len(b) <= 32 for b in grouped)
    assert _padded(grouped, lengths) < 0.8 * _padded(plain, lengths)
    # Batch order is shuffled, not sorted by length, and the epochs differ.
    first = [max(lengths[i] for i in b) for b in grouped]
    assert first != sorted(first) and first != sorted(first, reverse=True)
    again = list(epoch_batches(2000, 32, 10_000, random.Random(5), lengths, pool=10))
    assert again != grouped
