"""UnicodeText holds any Unicode text, including through vector-env shared memory."""

import copy
import multiprocessing as mp

from gymnasium.vector.utils import create_shared_memory, read_from_shared_memory, write_to_shared_memory

from rapo_env.spaces import UnicodeText


def test_any_unicode_within_the_length_bounds_is_contained():
    space = UnicodeText(max_length=20)
    for text in ["", "plain", "∑ π 你好 😀", "\x00\x07 control", "x" * 20]:
        assert space.contains(text)
    assert not space.contains("x" * 21)
    assert not space.contains(b"bytes")
    assert not space.contains(3)


def test_samples_are_members():
    space = UnicodeText(max_length=32, seed=0)
    assert all(space.contains(space.sample()) for _ in range(50))


def test_shared_memory_round_trips_unicode_exactly():
    space = UnicodeText(max_length=16)
    memory = create_shared_memory(space, n=3, ctx=mp)
    texts = ["∑ 你好 😀", "", "\x00zero\x00"]
    for index, text in enumerate(texts):
        write_to_shared_memory(space, index, text, memory)
    view = read_from_shared_memory(space, memory, n=3)
    assert view == tuple(texts)
    write_to_shared_memory(space, 0, "short", memory)
    assert view[0] == "short", "the view must follow later writes, as AsyncVectorEnv reads it only once"
    assert copy.deepcopy(view) == ("short", "", "\x00zero\x00") and isinstance(copy.deepcopy(view), tuple)
