package baton

import (
	"errors"
	"strings"
)

// ErrorKind is a case of the contract's `error` variant.
type ErrorKind uint8

// The cases of the contract's `error` variant, in its order.
const (
	// KindNoSuchStore: the pipeline declares no store of this name.
	KindNoSuchStore ErrorKind = iota
	// KindNoSuchTopic: the pipeline declares no output topic of this name.
	KindNoSuchTopic
	// KindInvalidValue: a stored value cannot be used as asked (e.g. a counter that is not
	// 8 bytes, or an overflow).
	KindInvalidValue
	// KindInvalidInput: the processor rejects its input or its configuration.
	KindInvalidInput
	// KindTooLarge: a key, value or record is larger than the pipeline's limits allow.
	KindTooLarge
	// KindLimit: a limit of the pipeline was reached (e.g. pending timers).
	KindLimit
	// KindOther: anything else.
	KindOther
)

var kindNames = [...]string{
	"no-such-store", "no-such-topic", "invalid-value", "invalid-input", "too-large", "limit", "other",
}

// String is the case's name in the contract (`invalid-input`, say).
func (k ErrorKind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "other"
}

// Error is an error the host knows: returned by state, timer and output calls, and returned
// by a processor to fail its record with a kind the host reports. Any other error a processor
// returns reaches the host as KindOther with its text.
type Error struct {
	Kind    ErrorKind
	Message string
}

// Error is the text the host shows: `invalid-input: message`, or the message alone for
// KindOther.
func (e *Error) Error() string {
	if e.Kind == KindOther || int(e.Kind) >= len(kindNames) {
		return e.Message
	}
	return kindNames[e.Kind] + ": " + e.Message
}

// Is reports whether target is an *Error of the same kind, so that
// errors.Is(err, &baton.Error{Kind: baton.KindNoSuchStore}) tests the kind.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Kind == e.Kind && (t.Message == "" || t.Message == e.Message)
}

// NewError is an *Error of kind with message.
func NewError(kind ErrorKind, message string) *Error { return &Error{Kind: kind, Message: message} }

// NoSuchStore is an error of kind KindNoSuchStore.
func NoSuchStore(message string) *Error { return &Error{KindNoSuchStore, message} }

// NoSuchTopic is an error of kind KindNoSuchTopic.
func NoSuchTopic(message string) *Error { return &Error{KindNoSuchTopic, message} }

// InvalidValue is an error of kind KindInvalidValue.
func InvalidValue(message string) *Error { return &Error{KindInvalidValue, message} }

// InvalidInput is an error of kind KindInvalidInput: the processor rejects its input or its
// configuration.
func InvalidInput(message string) *Error { return &Error{KindInvalidInput, message} }

// TooLarge is an error of kind KindTooLarge.
func TooLarge(message string) *Error { return &Error{KindTooLarge, message} }

// Limit is an error of kind KindLimit.
func Limit(message string) *Error { return &Error{KindLimit, message} }

// Other is an error of kind KindOther.
func Other(message string) *Error { return &Error{KindOther, message} }

// KindOf is the kind err reaches the host with: that of the first *Error in its chain, else
// KindOther.
func KindOf(err error) ErrorKind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return KindOther
}

// toWit is err as the contract's `error` variant: the kind of the first *Error in its chain
// and its message; when that *Error is wrapped, the whole text with the wrapped error's own
// text cut down to its message ("closing: x", not "closing: invalid-input: x").
func toWit(err error) (ErrorKind, string) {
	var e *Error
	if !errors.As(err, &e) {
		return KindOther, err.Error()
	}
	if error(e) == err {
		return e.Kind, e.Message
	}
	return e.Kind, strings.Replace(err.Error(), e.Error(), e.Message, 1)
}
