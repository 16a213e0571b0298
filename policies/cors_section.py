"""The ``cors:`` section (off unless present): which browser origins may call the gateway.

``origins`` lists exact origins (``https://app.example.com``) or ``"*"``; ``headers`` the
request headers a preflight may ask for (``"*"``: whatever it asks for, echoed back, which
is how ``authorization`` gets through: browsers never let the wildcard cover it);
``credentials`` lets the browser send cookies and client certificates (not with ``"*"``
origins, which browsers refuse); ``max_age`` how long a preflight's answer is cached.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.fields import Fields


@dataclass(frozen=True)
class Cors:
    origins: tuple[str, ...]
    headers: tuple[str, ...] = ("*",)
    credentials: bool = False
    max_age: float = 600.0  # seconds a browser may cache a preflight's answer


def load_cors(top: Fields) -> Cors | None:
    if not top.has("cors"):
        return None
    f = top.sub("cors", {"origins", "headers", "credentials", "max_age"})
    origins = f.str_list("origins")
    if not origins:
        f.error("cors.origins", 'is required: the origins allowed, or ["*"]')
        origins = ()
    for number, origin in enumerate(origins):
        if origin != "*" and ("://" not in origin or origin.endswith("/")):
            f.error(
                f"cors.origins[{number}]",
                f'{origin!r} is not an origin (scheme://host[:port], no path) or "*"',
            )
    credentials = f.flag("credentials", False)
    if credentials and "*" in origins:
        f.error("cors.credentials", 'cannot be true with origins ["*"] (browsers refuse it)')
    return Cors(
        origins=origins,
        headers=f.str_list("headers") or ("*",),
        credentials=credentials,
        max_age=f.duration("max_age", 600.0),
    )
