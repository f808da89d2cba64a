"""The text a stream sends: what is certain, never a stop string or what follows it."""

from specbound.serve.text import TextStream

WORDS = ["a", "b", "c", "stop", "d", "é"]


def decode(tokens):
    return "".join(WORDS[token] for token in tokens)


def test_the_pieces_add_up_to_the_text():
    stream = TextStream(decode)
    pieces = [stream.push([0, 1]), stream.push([2]), stream.push([4]), stream.finish()]
    assert "".join(pieces) == "abcd" and pieces[0] == "ab"


def test_a_stop_string_is_cut_with_everything_after_it():
    stream = TextStream(decode, ("op",))
    assert stream.push([0, 1]) == "ab"
    assert stream.push([3, 4]) == "st" and stream.stopped
    assert stream.finish() == ""


def test_a_possible_start_of_a_stop_string_waits():
    stream = TextStream(decode, ("cx",))
    assert stream.push([0, 2]) == "a"  # "c" may begin "cx"
    assert stream.push([1]) == "cb" and not stream.stopped
    assert stream.finish() == ""


def test_an_unfinished_character_waits():
    stream = TextStream(lambda tokens: "ab\ufffd" if len(tokens) == 1 else "abé")
    assert stream.push([0]) == "ab"
    assert stream.push([1]) == "é"
