package baton

import "strconv"

// Config is the pipeline's `config` object, flattened: string values as they are, any other
// JSON value as its JSON text.
type Config struct {
	values map[string]string
}

// NewConfig is a Config of the given pairs (for tests).
func NewConfig(values map[string]string) Config {
	c := Config{values: make(map[string]string, len(values))}
	for k, v := range values {
		c.values[k] = v
	}
	return c
}

// Get is the value of key; false when it is missing.
func (c Config) Get(key string) (string, bool) {
	v, ok := c.values[key]
	return v, ok
}

// Has reports whether key is set.
func (c Config) Has(key string) bool {
	_, ok := c.values[key]
	return ok
}

// Require is the value of key, or an InvalidInput error naming the missing key.
func (c Config) Require(key string) (string, error) {
	v, ok := c.values[key]
	if !ok {
		return "", InvalidInput("config key `" + key + "` is required")
	}
	return v, nil
}

// RequireInt is the value of key as a (64-bit) integer, or an InvalidInput error naming the
// key.
func (c Config) RequireInt(key string) (int64, error) {
	v, err := c.Require(key)
	if err != nil {
		return 0, err
	}
	n, perr := strconv.ParseInt(v, 10, 64)
	if perr != nil {
		return 0, InvalidInput("config key `" + key + "` must be an integer")
	}
	return n, nil
}

// Keys are the config's keys, in no particular order.
func (c Config) Keys() []string {
	out := make([]string, 0, len(c.values))
	for k := range c.values {
		out = append(out, k)
	}
	return out
}
