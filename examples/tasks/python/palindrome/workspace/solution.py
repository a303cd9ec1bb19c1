def is_palindrome(s):
    raise NotImplementedError
