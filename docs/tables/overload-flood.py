"""The replay's own table: overload-flood."""
from replay import raw

print(raw('--policy', 'config/overload.toml', '--scenario', 'config/scenarios/overload-flood.toml', '--compare', 'disciplines', '--seed', '1'), end="")
