package dbpool

import (
	"net/url"
	"slices"
	"strings"
)

// redactedMask replaces a password, as pgx's own redaction does.
const redactedMask = "xxxxx"

// unparseableConnString stands in for a key=value string too malformed to
// find its password in: showing nothing is the only safe choice.
const unparseableConnString = "(connection string not shown: it could not be parsed)"

// Redact returns connString, a PostgreSQL URL or key=value string, with
// every password (the URL's user info, and password or sslpassword
// parameters) replaced by "xxxxx". A URL is redacted even when malformed,
// masking more rather than less where its boundaries are ambiguous; a
// key=value string that cannot be tokenized is not shown at all.
func Redact(connString string) string {
	spans, ok := secretSpans(connString)
	if !ok {
		return unparseableConnString
	}
	var b strings.Builder
	last := 0
	for _, sp := range spans {
		b.WriteString(connString[last:sp.start])
		b.WriteString(redactedMask)
		last = sp.end
	}
	b.WriteString(connString[last:])
	return b.String()
}

// span is the byte range of one secret value in a connection string.
type span struct{ start, end int }

func isURL(s string) bool {
	return strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://")
}

func isPasswordKey(key string) bool {
	return strings.EqualFold(key, "password") || strings.EqualFold(key, "sslpassword")
}

// secretSpans finds the password values of a connection string, sorted and
// merged. ok is false for a key=value string that cannot be tokenized.
func secretSpans(s string) (spans []span, ok bool) {
	if isURL(s) {
		spans = urlSecretSpans(s)
	} else if spans, ok = keywordValueSecretSpans(s); !ok {
		return nil, false
	}
	slices.SortFunc(spans, func(a, b span) int { return a.start - b.start })
	var merged []span
	for _, sp := range spans {
		if n := len(merged); n > 0 && sp.start <= merged[n-1].end {
			merged[n-1].end = max(merged[n-1].end, sp.end)
			continue
		}
		merged = append(merged, sp)
	}
	return merged, true
}

// urlSecretSpans never fails: it looks at the URL the way a lenient reader
// would, so that a URL pgx rejects (and may quote back in its error) is
// still masked. The user info ends at the last '@', so that an unescaped
// '@', '/' or '?' inside a password does not cut the mask short; an '@' in
// the query makes it mask too much, never too little. Query parameters are
// scanned separately from the first '?'.
func urlSecretSpans(s string) []span {
	var spans []span
	rest := strings.Index(s, "://") + len("://")
	if at := strings.LastIndexByte(s[rest:], '@'); at >= 0 {
		if colon := strings.IndexByte(s[rest:rest+at], ':'); colon >= 0 && colon+1 < at {
			spans = append(spans, span{rest + colon + 1, rest + at})
		}
	}
	q := strings.IndexByte(s[rest:], '?')
	if q < 0 {
		return spans
	}
	pos := rest + q + 1
	for _, pair := range strings.Split(s[pos:], "&") {
		key, value, hasValue := strings.Cut(pair, "=")
		if decoded, err := url.QueryUnescape(key); err == nil {
			key = decoded
		}
		if hasValue && value != "" && isPasswordKey(strings.TrimSpace(key)) {
			start := pos + len(pair) - len(value)
			spans = append(spans, span{start, start + len(value)})
		}
		pos += len(pair) + 1
	}
	return spans
}

const kvSpace = " \t\n\r\v\f"

// keywordValueSecretSpans tokenizes the way libpq and pgx do: a keyword, an
// '=', then a value that is either single-quoted (with backslash escapes)
// or runs to the next space (with backslash escapes).
func keywordValueSecretSpans(s string) ([]span, bool) {
	var spans []span
	isSpace := func(c byte) bool { return strings.IndexByte(kvSpace, c) >= 0 }
	i := 0
	skipSpace := func() {
		for i < len(s) && isSpace(s[i]) {
			i++
		}
	}
	for {
		skipSpace()
		if i == len(s) {
			return spans, true
		}
		keyStart := i
		for i < len(s) && s[i] != '=' && !isSpace(s[i]) {
			i++
		}
		key := s[keyStart:i]
		skipSpace()
		if i == len(s) || s[i] != '=' || key == "" {
			return nil, false
		}
		i++
		skipSpace()
		valueStart := i
		if i < len(s) && s[i] == '\'' {
			i++
			for i < len(s) && s[i] != '\'' {
				if s[i] == '\\' {
					i++
				}
				i++
			}
			if i >= len(s) {
				return nil, false // unterminated quote
			}
			i++
		} else {
			for i < len(s) && !isSpace(s[i]) {
				if s[i] == '\\' {
					i++
				}
				i++
			}
			i = min(i, len(s))
		}
		if isPasswordKey(key) && i > valueStart {
			spans = append(spans, span{valueStart, i})
		}
	}
}

// connStringSecrets returns the password values of a connection string in
// every spelling an error message might quote them in: as written, and
// decoded. ok is false when the string could not be tokenized, and then the
// secrets are unknown.
func connStringSecrets(s string) (secrets []string, ok bool) {
	spans, ok := secretSpans(s)
	if !ok {
		return nil, false
	}
	for _, sp := range spans {
		raw := s[sp.start:sp.end]
		secrets = append(secrets, raw)
		if decoded, err := url.PathUnescape(raw); err == nil {
			secrets = append(secrets, decoded)
		}
		if decoded, err := url.QueryUnescape(raw); err == nil {
			secrets = append(secrets, decoded)
		}
		if !isURL(s) {
			// A key=value value may be quoted and backslash-escaped; the
			// driver quotes it back decoded.
			unquoted := raw
			if len(raw) >= 2 && raw[0] == '\'' && raw[len(raw)-1] == '\'' {
				unquoted = raw[1 : len(raw)-1]
			}
			secrets = append(secrets, unquoted, unescapeKeywordValue(unquoted))
		}
	}
	return secrets, true
}

// scrub replaces every occurrence of the secrets in msg, longest first so
// that a secret containing another is masked whole.
func scrub(msg string, secrets ...string) string {
	secrets = slices.Clone(secrets)
	slices.SortFunc(secrets, func(a, b string) int { return len(b) - len(a) })
	for _, s := range secrets {
		if s != "" {
			msg = strings.ReplaceAll(msg, s, redactedMask)
		}
	}
	return msg
}

// redactedError carries a message from which known secrets were scrubbed.
// Unwrap keeps the cause reachable for errors.As (a *dbpool.PgError's
// SQLSTATE, an AWS API error code); the drivers' own messages do not carry
// passwords, but this one is the one that gets logged.
type redactedError struct {
	msg string
	err error
}

// Error is the scrubbed message.
func (e *redactedError) Error() string { return e.msg }

// Unwrap returns the original error.
func (e *redactedError) Unwrap() error { return e.err }

// redactError returns err with the secrets scrubbed from its message.
func redactError(err error, secrets ...string) error {
	if err == nil {
		return nil
	}
	return &redactedError{msg: scrub(err.Error(), secrets...), err: err}
}

// setConnStringParam sets key=value in a connection string, replacing any
// value the string already has for key.
func setConnStringParam(s, key, value string) string {
	if !isURL(s) {
		// pgx, like libpq, lets the last occurrence of a keyword win.
		return s + " " + key + "=" + quoteKeywordValue(value)
	}
	// In a URL the first occurrence wins, so drop any existing one.
	base, query, _ := strings.Cut(s, "?")
	var kept []string
	for _, pair := range strings.Split(query, "&") {
		k, _, _ := strings.Cut(pair, "=")
		if decoded, err := url.QueryUnescape(k); err == nil && decoded == key || pair == "" {
			continue
		}
		kept = append(kept, pair)
	}
	kept = append(kept, url.QueryEscape(key)+"="+url.QueryEscape(value))
	return base + "?" + strings.Join(kept, "&")
}

// unescapeKeywordValue drops the backslash before each escaped character.
func unescapeKeywordValue(v string) string {
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		if v[i] == '\\' && i+1 < len(v) {
			i++
		}
		b.WriteByte(v[i])
	}
	return b.String()
}

func quoteKeywordValue(v string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}
