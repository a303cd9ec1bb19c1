from solution import word_count


def test_counts():
    assert word_count("the cat and The hat") == {"the": 2, "cat": 1, "and": 1, "hat": 1}


def test_punctuation():
    assert word_count("go, go! stop.") == {"go": 2, "stop": 1}


def test_empty():
    assert word_count("") == {}
