"""The root of trit's errors: everything raised about a user's input derives from :class:`TritError`.

The CLI turns a ``TritError`` into one line on stderr and exit status 2.
"""


class TritError(Exception):
    """An input trit refuses (a file, a tensor, a flag): the message names it and says what was expected."""


class OptionError(TritError, ValueError):
    """An option outside the range it allows (a sampling setting, a prompt longer than the context)."""


class ConvertError(TritError, ValueError):
    """A conversion (quantize, import, heal) that cannot go ahead, or its output folder; nothing was written."""


class ConfigError(OptionError):
    """A typed config (:mod:`trit.configs`) given a value its field does not allow; names the config and the field.
    The CLI says it again with the flag the field comes from."""

    def __init__(self, config: str, field: str, value: object, expected: str):
        super().__init__(f"{config}({field}={value!r}): expected {expected}")
        self.config, self.field, self.value, self.expected = config, field, value, expected
