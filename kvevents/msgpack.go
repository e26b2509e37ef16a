package kvevents

import (
	"encoding/binary"
	"errors"
	"math"
)

// reader is an allocation-free pull parser over one MessagePack document.
// Every method reads one complete value, or fails; it never reads past the
// end of b, so a truncated or hostile payload yields an error, not a panic.
// Nesting is bounded by maxDepth when skipping values the decoder does not
// interpret.
type reader struct {
	b   []byte
	off int
}

// maxDepth bounds the nesting of skipped values (unknown fields).
const maxDepth = 32

var (
	errTruncated = errors.New("truncated payload")
	errType      = errors.New("unexpected value type")
	errTooDeep   = errors.New("values nested too deeply")
)

// MessagePack format bytes used below.
const (
	mpNil      = 0xc0
	mpFalse    = 0xc2
	mpTrue     = 0xc3
	mpBin8     = 0xc4
	mpBin16    = 0xc5
	mpBin32    = 0xc6
	mpExt8     = 0xc7
	mpExt16    = 0xc8
	mpExt32    = 0xc9
	mpFloat32  = 0xca
	mpFloat64  = 0xcb
	mpUint8    = 0xcc
	mpUint16   = 0xcd
	mpUint32   = 0xce
	mpUint64   = 0xcf
	mpInt8     = 0xd0
	mpInt16    = 0xd1
	mpInt32    = 0xd2
	mpInt64    = 0xd3
	mpFixExt1  = 0xd4
	mpFixExt2  = 0xd5
	mpFixExt4  = 0xd6
	mpFixExt8  = 0xd7
	mpFixExt16 = 0xd8
	mpStr8     = 0xd9
	mpStr16    = 0xda
	mpStr32    = 0xdb
	mpArray16  = 0xdc
	mpArray32  = 0xdd
	mpMap16    = 0xde
	mpMap32    = 0xdf
)

func (r *reader) peek() (byte, error) {
	if r.off >= len(r.b) {
		return 0, errTruncated
	}
	return r.b[r.off], nil
}

// take returns the next n bytes.
func (r *reader) take(n int) ([]byte, error) {
	if n < 0 || n > len(r.b)-r.off {
		return nil, errTruncated
	}
	p := r.b[r.off : r.off+n]
	r.off += n
	return p, nil
}

// uintN reads an n-byte big-endian unsigned integer (n is 1, 2, 4 or 8).
func (r *reader) uintN(n int) (uint64, error) {
	p, err := r.take(n)
	if err != nil {
		return 0, err
	}
	switch n {
	case 1:
		return uint64(p[0]), nil
	case 2:
		return uint64(binary.BigEndian.Uint16(p)), nil
	case 4:
		return uint64(binary.BigEndian.Uint32(p)), nil
	default:
		return binary.BigEndian.Uint64(p), nil
	}
}

// isNil consumes a nil and reports true, or consumes nothing.
func (r *reader) isNil() bool {
	if r.off < len(r.b) && r.b[r.off] == mpNil {
		r.off++
		return true
	}
	return false
}

// integer reads any MessagePack integer. neg reports a negative value, in
// which case v holds its two's-complement bits.
func (r *reader) integer() (v uint64, neg bool, err error) {
	c, err := r.peek()
	if err != nil {
		return 0, false, err
	}
	switch {
	case c <= 0x7f:
		r.off++
		return uint64(c), false, nil
	case c >= 0xe0:
		r.off++
		return uint64(int64(int8(c))), true, nil
	}
	r.off++
	switch c {
	case mpUint8, mpUint16, mpUint32, mpUint64:
		v, err = r.uintN(1 << (c - mpUint8))
		return v, false, err
	case mpInt8:
		v, err = r.uintN(1)
		x := int64(int8(v))
		return uint64(x), x < 0, err
	case mpInt16:
		v, err = r.uintN(2)
		x := int64(int16(v))
		return uint64(x), x < 0, err
	case mpInt32:
		v, err = r.uintN(4)
		x := int64(int32(v))
		return uint64(x), x < 0, err
	case mpInt64:
		v, err = r.uintN(8)
		return v, int64(v) < 0, err
	}
	r.off--
	return 0, false, errType
}

// float reads a float or an integer as a float64.
func (r *reader) float() (float64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	switch c {
	case mpFloat32:
		r.off++
		v, err := r.uintN(4)
		return float64(math.Float32frombits(uint32(v))), err
	case mpFloat64:
		r.off++
		v, err := r.uintN(8)
		return math.Float64frombits(v), err
	}
	v, neg, err := r.integer()
	if neg {
		return float64(int64(v)), err
	}
	return float64(v), err
}

// raw reads a string or a binary value and returns its bytes, which alias
// the payload.
func (r *reader) raw() ([]byte, error) {
	c, err := r.peek()
	if err != nil {
		return nil, err
	}
	var n uint64
	switch {
	case c >= 0xa0 && c <= 0xbf:
		r.off++
		n = uint64(c & 0x1f)
	case c == mpStr8 || c == mpBin8:
		r.off++
		n, err = r.uintN(1)
	case c == mpStr16 || c == mpBin16:
		r.off++
		n, err = r.uintN(2)
	case c == mpStr32 || c == mpBin32:
		r.off++
		n, err = r.uintN(4)
	default:
		return nil, errType
	}
	if err != nil {
		return nil, err
	}
	return r.take(int(n))
}

// arrayLen reads an array header. The length is checked against the bytes
// left, each element taking at least one byte, so that callers may size
// buffers by it.
func (r *reader) arrayLen() (int, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case c >= 0x90 && c <= 0x9f:
		r.off++
		n = uint64(c & 0x0f)
	case c == mpArray16:
		r.off++
		n, err = r.uintN(2)
	case c == mpArray32:
		r.off++
		n, err = r.uintN(4)
	default:
		return 0, errType
	}
	if err != nil {
		return 0, err
	}
	if n > uint64(len(r.b)-r.off) {
		return 0, errTruncated
	}
	return int(n), nil
}

// mapLen reads a map header; like arrayLen, the length is checked against
// the bytes left (two per entry at least).
func (r *reader) mapLen() (int, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case c >= 0x80 && c <= 0x8f:
		r.off++
		n = uint64(c & 0x0f)
	case c == mpMap16:
		r.off++
		n, err = r.uintN(2)
	case c == mpMap32:
		r.off++
		n, err = r.uintN(4)
	default:
		return 0, errType
	}
	if err != nil {
		return 0, err
	}
	if n > uint64(len(r.b)-r.off)/2 {
		return 0, errTruncated
	}
	return int(n), nil
}

// isArray and isMap report the type of the next value without consuming it.
func (r *reader) isArray() bool {
	c, err := r.peek()
	return err == nil && (c >= 0x90 && c <= 0x9f || c == mpArray16 || c == mpArray32)
}

func (r *reader) isMap() bool {
	c, err := r.peek()
	return err == nil && (c >= 0x80 && c <= 0x8f || c == mpMap16 || c == mpMap32)
}

// skip consumes one value of any type, nested at most maxDepth-depth deep.
func (r *reader) skip(depth int) error {
	if depth >= maxDepth {
		return errTooDeep
	}
	c, err := r.peek()
	if err != nil {
		return err
	}
	switch {
	case c <= 0x7f || c >= 0xe0 || c == mpNil || c == mpFalse || c == mpTrue:
		r.off++
		return nil
	case c >= 0x80 && c <= 0x8f || c == mpMap16 || c == mpMap32:
		n, err := r.mapLen()
		if err != nil {
			return err
		}
		for range 2 * n {
			if err := r.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case c >= 0x90 && c <= 0x9f || c == mpArray16 || c == mpArray32:
		n, err := r.arrayLen()
		if err != nil {
			return err
		}
		for range n {
			if err := r.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case c >= 0xa0 && c <= 0xbf || c == mpStr8 || c == mpStr16 || c == mpStr32 ||
		c == mpBin8 || c == mpBin16 || c == mpBin32:
		_, err := r.raw()
		return err
	}
	r.off++
	var n uint64
	switch c {
	case mpUint8, mpInt8:
		n = 1
	case mpUint16, mpInt16:
		n = 2
	case mpUint32, mpInt32, mpFloat32:
		n = 4
	case mpUint64, mpInt64, mpFloat64:
		n = 8
	case mpFixExt1, mpFixExt2, mpFixExt4, mpFixExt8, mpFixExt16:
		n = 1 + 1<<(c-mpFixExt1)
	case mpExt8, mpExt16, mpExt32:
		l, err := r.uintN(1 << (c - mpExt8))
		if err != nil {
			return err
		}
		n = l + 1
	default: // 0xc1 is never used
		return errType
	}
	if n > uint64(len(r.b)-r.off) {
		return errTruncated
	}
	r.off += int(n)
	return nil
}
