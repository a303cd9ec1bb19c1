from solution import is_palindrome


def test_phrase():
    assert is_palindrome("A man, a plan, a canal: Panama")


def test_not():
    assert not is_palindrome("gyre")


def test_empty():
    assert is_palindrome("")
