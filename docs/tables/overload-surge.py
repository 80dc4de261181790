"""The replay's own table: overload-surge."""
from replay import raw

print(raw('--policy', 'config/overload.toml', '--scenario', 'config/scenarios/overload-surge.toml', '--compare', 'disciplines', '--seed', '1'), end="")
