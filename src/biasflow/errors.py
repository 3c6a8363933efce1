"""Exceptions with messages that name the file, row or option at fault."""


class BiasflowError(Exception):
    """Base class: the message is meant for the user as-is."""


class ChecksumError(BiasflowError):
    pass


class DownloadError(BiasflowError):
    pass


class DataFormatError(BiasflowError):
    pass


class ConfigError(BiasflowError):
    pass


class ModelLoadError(BiasflowError):
    pass


class GenerationError(BiasflowError):
    """Too many generation requests failed; the answered ones are cached and a re-run retries the rest."""
