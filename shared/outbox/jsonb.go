package outbox

import (
	"fmt"
	"unicode/utf8"
)

// The rules PostgreSQL's jsonb and the outbox hold a payload to, which the
// database's outbox.enqueue applies too (outbox.stored_bytes and
// outbox.payload_problem): the size that counts is the payload's text as
// jsonb keeps and returns it, and numbers and nesting are bounded so that
// a short text cannot become a long one, nor one the dispatcher cannot
// decode.
const (
	// MaxNestingDepth is the deepest nesting of arrays and objects a
	// payload may have: Go's encoding/json, which the dispatcher decodes
	// envelopes with, refuses deeper.
	MaxNestingDepth = 10000
	// MaxNumberExponent bounds a payload's numbers: their magnitude lies
	// below 1e1000 and, unless zero, at or above 1e-1000, so that none is
	// stored as more than a thousand digits (jsonb writes numbers out in
	// full: 1e131071 is eight bytes sent and 131,072 returned).
	MaxNumberExponent = 1000
	// numeric, behind every jsonb number, holds at most 131,072 digits
	// before the decimal point and 16,383 after it.
	maxNumericIntegerDigits  = 131072
	maxNumericFractionDigits = 16383
)

// StoredSize is the size of payload (a JSON document) as PostgreSQL stores
// and returns it: the bytes of its jsonb text, which is what the outbox's
// size limit holds and what a dispatcher loads and sends. It reports what
// jsonb or the outbox refuses in the document instead, if anything.
func StoredSize(payload []byte) (int, error) {
	size, problem := storedSize(payload)
	if problem != "" {
		return 0, fmt.Errorf("outbox: payload %s", problem)
	}
	return size, nil
}

// storedSize walks a document as jsonb parses it and measures the text
// jsonb writes out (JsonbToCString): no spaces but ", " and ": ", an
// object's keys once each (the last value of a repeated key wins), strings
// with their escapes resolved and written again as jsonb escapes them, and
// numbers as numeric writes them. Hand-written because no JSON library
// measures jsonb's text; encoding/json's token reader would decode numbers
// and allocate per token.
func storedSize(b []byte) (int, string) {
	if !utf8.Valid(b) {
		return 0, "is not valid UTF-8"
	}
	w := jsonbWalker{b: b}
	w.space()
	size, problem := w.value()
	if problem != "" {
		return 0, problem
	}
	w.space()
	if w.i != len(w.b) {
		return 0, "is not valid JSON"
	}
	if w.soft != "" {
		return 0, w.soft
	}
	return size, ""
}

type jsonbWalker struct {
	b     []byte
	i     int
	depth int
	// soft is the first problem met in the member of an object being read
	// that jsonb itself does not refuse: a number too large or nesting too
	// deep. It counts only if the member is kept: jsonb keeps the last
	// value of a repeated key, and what it drops is never stored or sent.
	soft string
}

func (w *jsonbWalker) space() {
	for w.i < len(w.b) {
		switch w.b[w.i] {
		case ' ', '\t', '\n', '\r':
			w.i++
		default:
			return
		}
	}
}

func (w *jsonbWalker) value() (int, string) {
	if w.i >= len(w.b) {
		return 0, "is not valid JSON"
	}
	switch c := w.b[w.i]; {
	case c == '{':
		return w.object()
	case c == '[':
		return w.array()
	case c == '"':
		_, size, problem := w.str(false)
		return size, problem
	case c == 't':
		return w.literal("true")
	case c == 'f':
		return w.literal("false")
	case c == 'n':
		return w.literal("null")
	case c == '-' || (c >= '0' && c <= '9'):
		return w.number()
	}
	return 0, "is not valid JSON"
}

func (w *jsonbWalker) literal(word string) (int, string) {
	if len(w.b)-w.i < len(word) || string(w.b[w.i:w.i+len(word)]) != word {
		return 0, "is not valid JSON"
	}
	w.i += len(word)
	return len(word), ""
}

// nest counts a level of nesting; deeper than MaxNestingDepth is a soft
// problem (see soft), and the walk goes on only as deep as jsonb would.
func (w *jsonbWalker) nest() {
	w.depth++
	if w.depth > MaxNestingDepth && w.soft == "" {
		w.soft = fmt.Sprintf("nests arrays and objects more than %d deep", MaxNestingDepth)
	}
}

// member is what an object keeps of one of its members.
type member struct {
	size int
	soft string
}

func (w *jsonbWalker) object() (int, string) {
	w.nest()
	w.i++ // {
	members := map[string]member{}
	outer := w.soft
	w.space()
	if w.i < len(w.b) && w.b[w.i] == '}' {
		w.i++
		w.depth--
		return 2, ""
	}
	for {
		w.space()
		if w.i >= len(w.b) || w.b[w.i] != '"' {
			return 0, "is not valid JSON"
		}
		key, keySize, problem := w.str(true)
		if problem != "" {
			return 0, problem
		}
		w.space()
		if w.i >= len(w.b) || w.b[w.i] != ':' {
			return 0, "is not valid JSON"
		}
		w.i++
		w.space()
		w.soft = ""
		valueSize, problem := w.value()
		if problem != "" {
			return 0, problem
		}
		members[key] = member{size: keySize + len(": ") + valueSize, soft: w.soft}
		if done, problem := w.separator('}'); problem != "" {
			return 0, problem
		} else if done {
			break
		}
	}
	w.depth--
	w.soft = outer
	size := len("{}") + len(", ")*(len(members)-1)
	for _, m := range members {
		size += m.size
		if w.soft == "" {
			w.soft = m.soft
		}
	}
	return size, ""
}

// separator reads what follows an object's member or an array's element:
// the closing byte (done), or a comma before the next.
func (w *jsonbWalker) separator(closing byte) (done bool, problem string) {
	w.space()
	switch {
	case w.i >= len(w.b):
		return false, "is not valid JSON"
	case w.b[w.i] == closing:
		w.i++
		return true, ""
	case w.b[w.i] != ',':
		return false, "is not valid JSON"
	}
	w.i++
	return false, ""
}

func (w *jsonbWalker) array() (int, string) {
	w.nest()
	w.i++ // [
	w.space()
	if w.i < len(w.b) && w.b[w.i] == ']' {
		w.i++
		w.depth--
		return 2, ""
	}
	size, n := len("[]"), 0
	for {
		w.space()
		s, problem := w.value()
		if problem != "" {
			return 0, problem
		}
		size += s
		n++
		if done, problem := w.separator(']'); problem != "" {
			return 0, problem
		} else if done {
			break
		}
	}
	w.depth--
	return size + len(", ")*(n-1), ""
}

// str reads a string and returns its size as jsonb writes it (quotes
// included) and, when asked, its decoded text (an object's key, to find a
// repeated one).
func (w *jsonbWalker) str(decode bool) (string, int, string) {
	w.i++ // the opening quote
	size := 2
	var text []byte
	for w.i < len(w.b) {
		c := w.b[w.i]
		switch {
		case c == '"':
			w.i++
			return string(text), size, ""
		case c < 0x20:
			return "", 0, "is not valid JSON"
		case c != '\\':
			size++
			if decode {
				text = append(text, c)
			}
			w.i++
			continue
		}
		// An escape.
		if w.i+1 >= len(w.b) {
			return "", 0, "is not valid JSON"
		}
		var r rune
		switch e := w.b[w.i+1]; e {
		case '"', '\\', '/':
			r = rune(e)
			w.i += 2
		case 'b':
			r, w.i = '\b', w.i+2
		case 'f':
			r, w.i = '\f', w.i+2
		case 'n':
			r, w.i = '\n', w.i+2
		case 'r':
			r, w.i = '\r', w.i+2
		case 't':
			r, w.i = '\t', w.i+2
		case 'u':
			code, ok := w.hex4(w.i + 2)
			if !ok {
				return "", 0, "is not valid JSON"
			}
			w.i += 6
			switch {
			case code == 0:
				return "", 0, `contains \u0000, which PostgreSQL jsonb cannot store`
			case code >= 0xDC00 && code <= 0xDFFF:
				return "", 0, "contains an unpaired UTF-16 low surrogate escape"
			case code >= 0xD800 && code <= 0xDBFF:
				if w.i+1 >= len(w.b) || w.b[w.i] != '\\' || w.b[w.i+1] != 'u' {
					return "", 0, "contains an unpaired UTF-16 high surrogate escape"
				}
				low, ok := w.hex4(w.i + 2)
				if !ok || low < 0xDC00 || low > 0xDFFF {
					return "", 0, "contains an unpaired UTF-16 high surrogate escape"
				}
				w.i += 6
				code = 0x10000 + (code-0xD800)<<10 + (low - 0xDC00)
			}
			r = code
		default:
			return "", 0, "is not valid JSON"
		}
		size += escapedSize(r)
		if decode {
			text = utf8.AppendRune(text, r)
		}
	}
	return "", 0, "is not valid JSON"
}

// escapedSize is how many bytes jsonb writes for one character of a
// string (escape_json): a two-character escape for the quote, the
// backslash and \b \f \n \r \t, \u00XX for the other control characters,
// and the character itself otherwise.
func escapedSize(r rune) int {
	switch {
	case r == '"' || r == '\\' || r == '\b' || r == '\f' || r == '\n' || r == '\r' || r == '\t':
		return 2
	case r < 0x20:
		return 6
	}
	return utf8.RuneLen(r)
}

func (w *jsonbWalker) hex4(at int) (rune, bool) {
	if at+4 > len(w.b) {
		return 0, false
	}
	var v rune
	for _, c := range w.b[at : at+4] {
		v <<= 4
		switch {
		case c >= '0' && c <= '9':
			v |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			v |= rune(c-'a') + 10
		case c >= 'A' && c <= 'F':
			v |= rune(c-'A') + 10
		default:
			return 0, false
		}
	}
	return v, true
}

// number reads a number and returns its size as numeric writes it: a minus
// sign unless it is zero, the integer digits without leading zeros (at
// least one), and as many fraction digits as the text had after its
// decimal point less its exponent (numeric_in's scale).
func (w *jsonbWalker) number() (int, string) {
	start := w.i
	negative := w.b[w.i] == '-'
	if negative {
		w.i++
	}
	intStart := w.i
	for w.i < len(w.b) && w.b[w.i] >= '0' && w.b[w.i] <= '9' {
		w.i++
	}
	intDigits := w.b[intStart:w.i]
	if len(intDigits) == 0 || (len(intDigits) > 1 && intDigits[0] == '0') {
		return 0, "is not valid JSON"
	}
	var fracDigits []byte
	if w.i < len(w.b) && w.b[w.i] == '.' {
		w.i++
		fracStart := w.i
		for w.i < len(w.b) && w.b[w.i] >= '0' && w.b[w.i] <= '9' {
			w.i++
		}
		fracDigits = w.b[fracStart:w.i]
		if len(fracDigits) == 0 {
			return 0, "is not valid JSON"
		}
	}
	exp := 0
	if w.i < len(w.b) && (w.b[w.i] == 'e' || w.b[w.i] == 'E') {
		w.i++
		expNegative := false
		if w.i < len(w.b) && (w.b[w.i] == '+' || w.b[w.i] == '-') {
			expNegative = w.b[w.i] == '-'
			w.i++
		}
		expStart := w.i
		for w.i < len(w.b) && w.b[w.i] >= '0' && w.b[w.i] <= '9' {
			if exp < 10*maxNumericIntegerDigits { // saturate: beyond this it is out of range anyway
				exp = exp*10 + int(w.b[w.i]-'0')
			}
			w.i++
		}
		if w.i == expStart {
			return 0, "is not valid JSON"
		}
		if expNegative {
			exp = -exp
		}
	}
	token := w.b[start:w.i]
	if len(intDigits)+exp > maxNumericIntegerDigits || len(fracDigits)-exp > maxNumericFractionDigits {
		return 0, fmt.Sprintf("has the number %s, beyond what PostgreSQL's numeric (and so jsonb) can hold", abbreviate(token))
	}

	// The digits as one string, with the decimal point pointAt digits
	// from its start once the exponent has moved it.
	digits := len(intDigits) + len(fracDigits)
	digitAt := func(k int) byte {
		if k < len(intDigits) {
			return intDigits[k]
		}
		return fracDigits[k-len(intDigits)]
	}
	pointAt := len(intDigits) + exp
	first := -1 // the first nonzero digit
	for k := 0; k < digits; k++ {
		if digitAt(k) != '0' {
			first = k
			break
		}
	}
	if first >= 0 {
		// The magnitude: 10^m <= |value| < 10^(m+1).
		if m := pointAt - first - 1; (m >= MaxNumberExponent || m < -MaxNumberExponent) && w.soft == "" {
			w.soft = fmt.Sprintf("has a number beyond ±1e%d or nearer to zero than ±1e-%d (it would be stored as over a thousand digits): %s",
				MaxNumberExponent, MaxNumberExponent, abbreviate(token))
		}
	}
	size := 1 // the integer part's "0" when it has no other digit
	if first >= 0 && first < pointAt {
		size = pointAt - first
	}
	if negative && first >= 0 {
		size++
	}
	if scale := len(fracDigits) - exp; scale > 0 {
		size += 1 + scale
	}
	return size, ""
}

func abbreviate(b []byte) string {
	if len(b) <= 24 {
		return string(b)
	}
	return string(b[:12]) + "…" + string(b[len(b)-8:])
}
