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


class TrackingError(BiasflowError):
    """The MLflow store is unreachable, broken or refused the results (the results on disk are unaffected)."""


class GenerationError(BiasflowError):
    """Too many generation requests failed; the answered ones are cached and a re-run retries the rest."""


class ServedModelError(BiasflowError):
    """A model server did not answer a request usably (HTTP errors after retries, timeouts, malformed replies)."""
