"""The replay's own table: routing-strategies."""
from replay import raw

print(raw('--policy', 'config/reference.toml', '--scenario', 'config/scenarios/routing.toml', '--compare', 'strategies', '--seed', '1'), end="")
