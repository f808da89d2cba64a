"""What the command-line tests share: the exception that stands for a model being loaded."""


class ModelWouldLoad(BaseException):
    """Raised where a command would load a model: every value before it was accepted (a
    BaseException, as KeyboardInterrupt is, so that no error handling of the command takes it)."""
