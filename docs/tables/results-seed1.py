"""The replay's own table: results-seed1."""
from replay import raw

print(raw('--policy', 'config/reference.toml', '--scenario', 'reference', '--compare', 'disciplines', '--seed', '1'), end="")
