"""One exception type for everything a user can get wrong; the CLI prints it in one line."""


class StreetlampError(Exception):
    """Bad input or an impossible request, explained in one line for the user."""
