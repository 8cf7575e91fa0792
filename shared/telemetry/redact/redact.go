// Package redact keeps secrets and message payloads out of telemetry: logs,
// trace documents and error texts that end up in either. The logging and
// tracing packages apply it to everything they write; code that stores an
// error text elsewhere (outbox.attempts.error_message, a Lambda response) can
// call [Error] itself.
//
// Two rules, both deliberately simple enough to state in one sentence each:
//
//   - A key is sensitive when its last word, or its last two or three words
//     run together, ends with one of: payload, password, passwd, passphrase,
//     pwd, secret, token, authorization, cookie, credential(s), apikey,
//     secretkey, privatekey, secretaccesskey. Words are split at '_', '-',
//     '.', spaces and camelCase boundaries, case-insensitively. So "payload",
//     "db_password", "PGPASSWORD", "X-Api-Key", "lease_token", "clientSecret"
//     and "AWS_SECRET_ACCESS_KEY" are sensitive, while "payload_bytes",
//     "secret_arn", "signing_secret_env", "tokens_in" and "message_id" are
//     not: a qualifier at the end names something about the secret, not the
//     secret itself, and operators need those.
//
//   - In any text, the password of a URL ("postgres://user:pass@host"), the
//     value of a sensitive key=value pair ("password=…", "sslpassword='…'",
//     "access_token=…"), the string value of a sensitive JSON member
//     ("\"password\":\"…\"") and the credential after "Bearer"/"Basic" are
//     replaced by [Mask]. Everything else — message ids, codes, hosts, the
//     rest of an error text — stays readable.
//
// Redaction is a safety net, not a licence: code should still not log
// payloads or secrets on purpose.
package redact

import (
	"regexp"
	"strings"
	"unicode"
)

// Mask replaces every redacted value.
const Mask = "[REDACTED]"

// sensitiveSuffixes end the keys that are sensitive; see the package
// documentation.
var sensitiveSuffixes = []string{
	"payload", "password", "passwd", "passphrase", "pwd", "secret", "token",
	"authorization", "cookie", "credential", "credentials", "apikey",
	"secretkey", "privatekey", "secretaccesskey",
}

// SensitiveKey reports whether an attribute, header, map or JSON key names a
// secret or a payload, by the rule in the package documentation.
func SensitiveKey(key string) bool {
	var words [3]string // the last three words, most recent last
	n := 0
	forEachWord(key, func(w string) {
		words[0], words[1], words[2] = words[1], words[2], w
		n++
	})
	if n == 0 {
		return false
	}
	last := words[2]
	if endsSensitive(last) {
		return true
	}
	if n >= 2 && endsSensitive(words[1]+last) {
		return true
	}
	return n >= 3 && endsSensitive(words[0]+words[1]+last)
}

// endsSensitive reports whether w ends with one of sensitiveSuffixes, so
// that words run together ("pgpassword", "sslpassword", "apitoken") count.
func endsSensitive(w string) bool {
	for _, s := range sensitiveSuffixes {
		if strings.HasSuffix(w, s) {
			return true
		}
	}
	return false
}

// forEachWord calls fn with each lower-cased word of key, split at
// separators and at camelCase boundaries ("clientSecret" → client, secret;
// "AWSSecretKey" → aws, secret, key).
func forEachWord(key string, fn func(string)) {
	runes := []rune(key)
	start := -1
	flush := func(end int) {
		if start >= 0 && end > start {
			fn(strings.ToLower(string(runes[start:end])))
		}
		start = -1
	}
	for i, r := range runes {
		if !unicode.IsLetter(r) && !unicode.IsDigit(r) {
			flush(i)
			continue
		}
		if start < 0 {
			start = i
			continue
		}
		prev := runes[i-1]
		lowerToUpper := unicode.IsUpper(r) && (unicode.IsLower(prev) || unicode.IsDigit(prev))
		acronymEnd := unicode.IsUpper(r) && unicode.IsUpper(prev) && i+1 < len(runes) && unicode.IsLower(runes[i+1])
		if lowerToUpper || acronymEnd {
			flush(i)
			start = i
		}
	}
	flush(len(runes))
}

// secretKeyPattern is the part of a key, in key=value and JSON text, that
// makes its value secret. It is looser than SensitiveKey on purpose (any key
// ending in one of these words): in free text we cannot tell a qualifier from
// the value, and over-redacting an error text costs little.
const secretKeyPattern = `[a-z0-9_.\-]*?(?:password|passwd|passphrase|pwd|secret|token|api[_\-]?key|private[_\-]?key|secret[_\-]?access[_\-]?key|authorization|credentials?|signature)`

var (
	// scheme://user:password@host — the password runs to the last '@'
	// before whitespace or a quote, so that an unencoded '@' in a password
	// leaks nothing (at worst the host is masked too).
	urlPassword = regexp.MustCompile(`(?i)\b([a-z][a-z0-9+.\-]*://[^\s:/?#@'"]*):[^\s'"]*@`)
	// password=value, password = 'quoted value', access_token=value; the
	// libpq key/value form and URL query parameters.
	keyValueSecret = regexp.MustCompile(`(?i)\b(` + secretKeyPattern + `)(\s*=\s*)(?:'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|[^\s&;,'"()\[\]{}]+)`)
	// "password":"value" in JSON text.
	jsonSecret = regexp.MustCompile(`(?i)("` + secretKeyPattern + `"\s*:\s*)"(?:[^"\\]|\\.)*"`)
	// \"password\":\"value\" in JSON that was itself quoted into a string
	// (an error text that embeds a response body).
	escapedJSONSecret = regexp.MustCompile(`(?i)(\\"` + secretKeyPattern + `\\"\s*:\s*)\\"(?:[^"\\]|\\[^"])*\\"`)
	// Authorization: Bearer <token>, Basic <credentials>. The credential must
	// hold a digit or a token68 symbol, so that prose ("basic validation")
	// stays readable.
	bearerCredential = regexp.MustCompile(`\b([Bb]earer|Basic)\s+[A-Za-z0-9\-._~+/]*[0-9\-._~+/][A-Za-z0-9\-._~+/]*=*`)
)

// String returns s with every credential it recognises replaced by [Mask]:
// URL passwords, values of sensitive key=value pairs and JSON members, and
// Bearer/Basic credentials. Text without any of them is returned unchanged
// and costs a few substring searches.
func String(s string) string {
	if strings.Contains(s, "://") && strings.Contains(s, "@") {
		s = urlPassword.ReplaceAllString(s, "${1}:"+Mask+"@")
	}
	if strings.Contains(s, "=") {
		s = keyValueSecret.ReplaceAllString(s, "${1}${2}"+Mask)
	}
	if strings.Contains(s, `":`) {
		s = jsonSecret.ReplaceAllString(s, `${1}"`+Mask+`"`)
		s = escapedJSONSecret.ReplaceAllString(s, `${1}\"`+Mask+`\"`)
	}
	if strings.Contains(s, "earer ") || strings.Contains(s, "Basic ") {
		s = bearerCredential.ReplaceAllString(s, "${1} "+Mask)
	}
	return s
}

// Error is err's text with credentials redacted, "" for a nil error. Use it
// wherever an error text leaves the process: a log attribute, a trace, the
// attempts archive. Drivers and SDKs put connection strings and request URLs
// into their error texts.
func Error(err error) string {
	if err == nil {
		return ""
	}
	return String(err.Error())
}
