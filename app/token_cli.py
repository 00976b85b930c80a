"""`flask token mint`: a Flask CLI plugin command (pyproject: entry point `flask.commands`), so the
`flask` command finds it without loading the app: it needs the configuration and the signing secret
only (app.tokens), not the database, the routes or the embedding model. Well under a second instead of
the several seconds of building the app (docs/decisions.md)."""

from __future__ import annotations

import click

from app.config import load_config
from app.tokens import mint_token, signing_secret

token_cli = click.Group("token", help="Access tokens for development and operations.")


@token_cli.command("mint")
@click.option("--org", required=True, help="org_id claim")
@click.option("--user", default="dev-user", show_default=True, help="user_id claim")
@click.option("--email", default=None, help="email claim")
@click.option("--scopes", default="read,write", show_default=True, help="comma-separated scopes")
@click.option("--role", default=None, help="role claim (admin, super_admin, …)")
@click.option("--product", default=None, help="product claim (default product when omitted)")
@click.option("--ttl", default=3600, show_default=True, type=int, help="lifetime in seconds")
def token_mint(org, user, email, scopes, role, product, ttl) -> None:
    """Print a bearer token signed with this deployment's JWT_SECRET (or its development secret in
    VAR_DIR/jwt-secret, as the server reads it)."""
    try:
        config = load_config()
        secret = signing_secret(config)
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(mint_token(
        secret=secret, issuer=config["JWT_ISSUER"], audience=config["JWT_AUDIENCE"],
        org=org, user=user, email=email, role=role, product=product, ttl=ttl,
        scopes=[s.strip() for s in scopes.split(",") if s.strip()],
    ))
